//! Each workspace's last sync, kept in the state directory, so that a restarted daemon
//! (and `mopd status`) shows it at once.

use mop_proto::status::WorkspaceStatus;

use crate::paths::Paths;

/// Loads a workspace's persisted status (or a fresh one); counters start again at zero.
pub fn load(paths: &Paths, ws: &str) -> WorkspaceStatus {
    std::fs::read(paths.status_file(ws))
        .ok()
        .and_then(|b| serde_json::from_slice::<WorkspaceStatus>(&b).ok())
        .map(|mut s| {
            s.stats = Default::default();
            s
        })
        .unwrap_or_else(|| WorkspaceStatus {
            workspace: ws.to_owned(),
            ..Default::default()
        })
}

/// Persists a workspace's status (replaced whole); a failure is logged.
pub fn save(paths: &Paths, status: &WorkspaceStatus) {
    let path = paths.status_file(&status.workspace);
    if let Err(e) = crate::files::replace_json(&path, status, true) {
        tracing::warn!(workspace = %status.workspace, path = %path.display(), error = %e, "cannot save sync status");
    }
}

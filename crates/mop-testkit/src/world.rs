//! One builder for the world most end-to-end tests need: a card server holding the example
//! cards in each workspace, a daemon synced to it with sandbox profiles, tokens for a
//! curator and a host, and the runner user that starts tasks. A test says only what is
//! different about its world:
//!
//! ```no_run
//! let Some(world) = mop_testkit::world::World::builder()
//!     .server_config("[limits]\nstores_per_task_per_minute = 2\n")
//!     .start()
//! else {
//!     return; // no runner user or bubblewrap here, and not under CI
//! };
//! let plan = world.prepare(&world.task("t1").user("alice"));
//! ```
//!
//! The typed helpers answer with `mop_proto` types (a prepare's [`mop_proto::Plan`], a
//! receipt, a curator's review queue or card details), so a test reads fields, not JSON
//! paths.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use crate::procs::{
    Daemon, DaemonOptions, Server, as_runner, bwrap_available, output_text, run, runner_user,
};
use crate::{example_cards_dir, profiles_config, repo_root};

/// The first workspace of every world.
pub const WS: &str = "acme";

/// The title tasks get unless a test names one: it matches example cards (L2).
pub const TITLE: &str = "Nightly ETL fails with ORA-01555";

/// A running world: server, daemon, tokens and the runner user.
pub struct World {
    /// The card server.
    pub server: Server,
    /// The host daemon, synced.
    pub daemon: Daemon,
    /// An admin (curator) token for every workspace of the world.
    pub admin: String,
    /// A node (host) token for every workspace of the world.
    pub node: String,
    /// The runner user's uid (this process's with [`WorldBuilder::as_this_user`]).
    pub uid: u32,
    /// The runner user's gid (this process's with [`WorldBuilder::as_this_user`]).
    pub gid: u32,
    /// The workspaces, the first one [`WS`].
    pub workspaces: Vec<String>,
    /// A curator's laptop: an empty home for `mop-curate` and the admin token in a file.
    curator_home: tempfile::TempDir,
}

/// The file in a world's curator home that holds the admin token.
const ADMIN_TOKEN_FILE: &str = "admin-token";

/// A curator's home holding `admin` in [`ADMIN_TOKEN_FILE`].
fn curator_home(admin: &str) -> tempfile::TempDir {
    let home = tempfile::tempdir().expect("a temporary directory");
    let file = home.path().join(ADMIN_TOKEN_FILE);
    std::fs::write(&file, admin).expect("write the admin token");
    // Only its owner may read a token file (mop-curate refuses one others can).
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
        .expect("restrict the admin token");
    home
}

/// What a world is made of, beyond the defaults.
pub struct WorldBuilder {
    workspaces: Vec<String>,
    server_config: String,
    daemon_config: String,
    test_profiles: bool,
    curator: Option<String>,
    offline_recheck_secs: Option<u64>,
    sandbox: bool,
    this_user: bool,
}

impl World {
    /// The world around a server and a daemon that a test started its own way (a proxy
    /// between them, replicas): a node token and the runner user are added as
    /// [`WorldBuilder::start`] would. The runner user must exist.
    pub fn around(server: Server, daemon: Daemon, admin: String, workspaces: &[&str]) -> World {
        let (uid, gid) = runner_user().expect("the runner user exists");
        let node = server.token("node", workspaces);
        World {
            server,
            daemon,
            curator_home: curator_home(&admin),
            admin,
            node,
            uid,
            gid,
            workspaces: workspaces.iter().map(|w| (*w).to_owned()).collect(),
        }
    }

    /// A world of one workspace ([`WS`]) holding the example cards.
    pub fn builder() -> WorldBuilder {
        WorldBuilder {
            workspaces: vec![WS.to_owned()],
            server_config: String::new(),
            daemon_config: String::new(),
            test_profiles: false,
            curator: None,
            offline_recheck_secs: None,
            sandbox: true,
            this_user: false,
        }
    }
}

impl WorldBuilder {
    /// These workspaces instead, each holding the example cards.
    pub fn workspaces(mut self, workspaces: &[&str]) -> Self {
        self.workspaces = workspaces.iter().map(|w| (*w).to_owned()).collect();
        self
    }

    /// Lines of the server's `server.toml`.
    pub fn server_config(mut self, toml: &str) -> Self {
        self.server_config = toml.to_owned();
        self
    }

    /// Lines added to the daemon's `mopd.toml` (after its profiles).
    pub fn daemon_config(mut self, toml: &str) -> Self {
        self.daemon_config = toml.to_owned();
        self
    }

    /// The daemon also knows the tests' own profiles (`tests/profiles`).
    pub fn test_profiles(mut self) -> Self {
        self.test_profiles = true;
        self
    }

    /// The admin token carries this person's name (what the audit shows) instead of
    /// "Test Curator".
    pub fn curator(mut self, name: &str) -> Self {
        self.curator = Some(name.to_owned());
        self
    }

    /// The daemon re-checks an unreachable server this often.
    pub fn offline_recheck_secs(mut self, secs: u64) -> Self {
        self.offline_recheck_secs = Some(secs);
        self
    }

    /// The world starts tasks without bubblewrap (`prepare` and agent calls only): it
    /// needs the runner user, not a working bwrap.
    pub fn without_sandbox(mut self) -> Self {
        self.sandbox = false;
        self
    }

    /// The world's tasks are this test process's own: no runner user and no sandbox, for
    /// tests that speak to the daemon's sockets themselves. Such a world starts anywhere.
    pub fn as_this_user(mut self) -> Self {
        self.this_user = true;
        self.sandbox = false;
        self
    }

    /// Starts the world, or answers `None` where it cannot run here (no runner user, or no
    /// working bubblewrap), which under CI fails instead (see [`runner_user`]).
    pub fn start(self) -> Option<World> {
        let (uid, gid) = if self.this_user {
            (
                nix::unistd::getuid().as_raw(),
                nix::unistd::getgid().as_raw(),
            )
        } else {
            runner_user()?
        };
        if self.sandbox && !bwrap_available() {
            return None;
        }
        let server = Server::start_with(&self.server_config);
        let workspaces: Vec<&str> = self.workspaces.iter().map(String::as_str).collect();
        let admin = match &self.curator {
            Some(name) => server.token_named("admin", &workspaces, Some(name)),
            None => server.token("admin", &workspaces),
        };
        let node = server.token("node", &workspaces);
        for ws in &workspaces {
            let out = server.import(&example_cards_dir(), ws);
            assert!(out.status.success(), "import: {}", output_text(&out));
        }
        let profiles = if self.test_profiles {
            profiles_config(&[&repo_root().join("tests/profiles")])
        } else {
            profiles_config(&[])
        };
        let extra = format!("{profiles}\n{}", self.daemon_config);
        let defaults = DaemonOptions::default();
        let daemon = Daemon::start(
            &server,
            DaemonOptions {
                workspaces: &workspaces,
                extra: &extra,
                offline_recheck_secs: self
                    .offline_recheck_secs
                    .unwrap_or(defaults.offline_recheck_secs),
                ..defaults
            },
        );
        daemon.wait_synced();
        Some(World {
            server,
            daemon,
            curator_home: curator_home(&admin),
            admin,
            node,
            uid,
            gid,
            workspaces: self.workspaces,
        })
    }
}

/// What a task is about, as `mop prepare` and `mop run` take it.
#[derive(Debug, Clone)]
pub struct Task {
    /// Its workspace.
    pub workspace: String,
    /// Its id.
    pub id: String,
    /// Who asked.
    pub user: Option<String>,
    /// What it targets.
    pub asset: Option<String>,
    /// The ticket title.
    pub title: String,
}

impl Task {
    /// The same task by another user.
    pub fn user(mut self, user: &str) -> Self {
        self.user = Some(user.to_owned());
        self
    }

    /// The same task for an asset.
    pub fn asset(mut self, asset: &str) -> Self {
        self.asset = Some(asset.to_owned());
        self
    }

    /// The same task with another title.
    pub fn title(mut self, title: &str) -> Self {
        self.title = title.to_owned();
        self
    }

    /// The same task in another workspace.
    pub fn workspace(mut self, ws: &str) -> Self {
        self.workspace = ws.to_owned();
        self
    }

    /// Its flags for `mop prepare` and `mop run`.
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "--workspace".into(),
            (&self.workspace).into(),
            "--task-id".into(),
            (&self.id).into(),
            "--title".into(),
            (&self.title).into(),
        ];
        if let Some(u) = &self.user {
            a.extend(["--user".into(), u.into()]);
        }
        if let Some(s) = &self.asset {
            a.extend(["--asset".into(), s.into()]);
        }
        a
    }
}

impl World {
    /// Task `id` in the first workspace, with the default title and no user or asset.
    pub fn task(&self, id: &str) -> Task {
        Task {
            workspace: self.workspaces[0].clone(),
            id: id.to_owned(),
            user: None,
            asset: None,
            title: TITLE.to_owned(),
        }
    }

    /// A working directory of the runner's, with mode `mode`.
    pub fn workdir_mode(&self, mode: u32) -> tempfile::TempDir {
        let w = tempfile::Builder::new().prefix("mopw").tempdir().unwrap();
        nix::unistd::chown(w.path(), Some(self.uid.into()), Some(self.gid.into())).unwrap();
        std::fs::set_permissions(w.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        w
    }

    /// A working directory of the runner's (0755).
    pub fn workdir(&self) -> tempfile::TempDir {
        self.workdir_mode(0o755)
    }

    /// The arguments of `mop run` for `task` in `workdir`, with `extra` flags, then
    /// `-- command…`.
    pub fn run_args(
        &self,
        task: &Task,
        workdir: &Path,
        extra: &[&str],
        command: &[&str],
    ) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "run".into(),
            "--socket".into(),
            self.daemon.socket().into(),
            "--workdir".into(),
            workdir.into(),
        ];
        a.extend(task.args());
        a.extend(extra.iter().map(OsString::from));
        a.push("--".into());
        a.extend(command.iter().map(OsString::from));
        a
    }

    /// `mop run` of `task` in `workdir` as the runner, with `extra` flags, then
    /// `-- command…`.
    pub fn mop_run(
        &self,
        task: &Task,
        workdir: &Path,
        extra: &[&str],
        command: &[&str],
    ) -> Command {
        let a = self.run_args(task, workdir, extra, command);
        let refs: Vec<&OsStr> = a.iter().map(OsString::as_os_str).collect();
        as_runner(&refs)
    }

    /// `mop prepare --json` of `task` as the runner: its plan, or the failed output.
    pub fn try_prepare(&self, task: &Task) -> Result<mop_proto::Plan, Output> {
        let mut a: Vec<OsString> = vec![
            "prepare".into(),
            "--socket".into(),
            self.daemon.socket().into(),
            "--json".into(),
        ];
        a.extend(task.args());
        let refs: Vec<&OsStr> = a.iter().map(OsString::as_os_str).collect();
        let out = run(&mut as_runner(&refs));
        if !out.status.success() {
            return Err(out);
        }
        Ok(serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("prepare --json: {e}: {}", output_text(&out))))
    }

    /// `mop prepare --json` of `task` as the runner, which must succeed.
    pub fn prepare(&self, task: &Task) -> mop_proto::Plan {
        self.try_prepare(task)
            .unwrap_or_else(|out| panic!("prepare {}: {}", task.id, output_text(&out)))
    }

    /// `mop release` of a task as the runner, which must succeed.
    pub fn release(&self, task_id: &str) {
        let socket = self.daemon.socket();
        let out = run(&mut as_runner(&[
            OsStr::new("release"),
            OsStr::new("--socket"),
            socket.as_os_str(),
            OsStr::new("--task-id"),
            OsStr::new(task_id),
        ]));
        assert!(
            out.status.success(),
            "release {task_id}: {}",
            output_text(&out)
        );
    }

    /// `mop receipt TASK --json` as the runner, which must succeed.
    pub fn receipt(&self, task_id: &str) -> mop_proto::receipts::Receipt {
        let socket = self.daemon.socket();
        let out = run(&mut as_runner(&[
            OsStr::new("receipt"),
            OsStr::new(task_id),
            OsStr::new("--json"),
            OsStr::new("--socket"),
            socket.as_os_str(),
        ]));
        assert!(
            out.status.success(),
            "receipt {task_id}: {}",
            output_text(&out)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("receipt --json: {e}: {}", output_text(&out)))
    }

    /// `mop-curate <args…>` as a curator on a laptop: the server's URL, the first
    /// workspace and the admin token (in a file) from the environment, and an empty home
    /// (no config file).
    pub fn curate(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(crate::procs::bin("mop-curate"));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.curator_home.path())
            .env("MOP_SERVER_URL", &self.server.url)
            .env("MOP_WORKSPACE", &self.workspaces[0])
            .env(
                "MOP_ADMIN_TOKEN_FILE",
                self.curator_home.path().join(ADMIN_TOKEN_FILE),
            );
        cmd
    }

    /// `mop-curate <args…>`, which must succeed, its `--json` answer read as `T` (a
    /// `mop_proto::curation` type).
    pub fn curate_as<T: serde::de::DeserializeOwned>(&self, args: &[&str]) -> T {
        let out = run(&mut self.curate(args));
        assert!(
            out.status.success(),
            "mop-curate {args:?}: {}",
            output_text(&out)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("mop-curate {args:?}: {e}: {}", output_text(&out)))
    }

    /// `mop memory <args…>` as the runner, inside the task `plan` describes (its agent
    /// socket), as an agent would call it.
    pub fn agent(&self, plan: &mop_proto::Plan, args: &[&str]) -> Output {
        let mut a = vec![OsStr::new("memory")];
        a.extend(args.iter().map(OsStr::new));
        let mut cmd = as_runner(&a);
        cmd.env(mop_proto::inside::env::AGENT_SOCKET, &plan.agent_socket);
        run(&mut cmd)
    }
}

/// Declares a test file's `Env`: a [`World`] (in its field `world`, and reached through
/// it: `env.server`, `env.daemon`, `env.workdir()`) with the file's own fields beside it,
/// so the file can give `Env` helpers of its own.
///
/// ```ignore
/// mop_testkit::world_env! {
///     /// The world of these tests, and the cards they expect.
///     Env { cards: mop_testkit::Workspace }
/// }
/// ```
#[macro_export]
macro_rules! world_env {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        struct $name {
            world: $crate::world::World,
            $($(#[$fmeta])* $field: $ty,)*
        }

        impl std::ops::Deref for $name {
            type Target = $crate::world::World;
            fn deref(&self) -> &$crate::world::World {
                &self.world
            }
        }

        impl std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut $crate::world::World {
                &mut self.world
            }
        }
    };
}

//! The task context a runner sends with a prepare request, its validation, and what
//! selection derives from it once: canonical error codes, lowercase words, search text.

use std::collections::{BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

use crate::codes::CodeExtractor;
use crate::id::{is_scope_id, is_slug, is_task_id};

/// Longest task title, in characters.
pub const MAX_TASK_TITLE_CHARS: usize = 1000;
/// Largest task description, in bytes.
pub const MAX_TASK_DESCRIPTION_BYTES: usize = 64 * 1024;
/// Most labels on a task.
pub const MAX_TASK_LABELS: usize = 64;
/// Longest task label, in characters.
pub const MAX_TASK_LABEL_CHARS: usize = 64;

/// What a task is about, as its runner describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskContext {
    /// `[A-Za-z0-9._-]`, 1–64 characters, starting with a letter or digit.
    pub task_id: String,
    /// The workspace whose cards the task may see.
    pub workspace: String,
    /// Who asked; no origin user means no L1 tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_user_id: Option<String>,
    /// What the task targets; no asset means no asset-bound card is ever selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asset_id: Option<String>,
    /// The project the task belongs to; no project means no project-bound card is ever
    /// selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// The kind of agent the task runs (`claude`, `codex` …); none means no agent-bound
    /// card is ever selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The ticket title.
    pub title: String,
    /// The ticket text.
    #[serde(default)]
    pub description: String,
    /// Free labels; compared with card labels and stacks case-insensitively.
    #[serde(default)]
    pub labels: Vec<String>,
}

/// Why a task context is refused. Each names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// The task id breaks the slug rule.
    #[error("task_id must be 1 to 64 characters of [A-Za-z0-9._-] starting with a letter or digit")]
    TaskId,
    /// The workspace name is not a slug.
    #[error("workspace must be a lowercase slug matching [a-z0-9][a-z0-9._-]{{0,63}}")]
    Workspace,
    /// A user, asset or project id is malformed.
    #[error(
        "{0} must be 1 to 128 characters with no control characters and no leading or trailing spaces"
    )]
    ScopeId(&'static str),
    /// The agent kind is not a slug.
    #[error("agent must be a lowercase slug matching [a-z0-9][a-z0-9._-]{{0,63}}")]
    Agent,
    /// The title is empty, multi-line or too long.
    #[error("title must be a single non-empty line of at most {MAX_TASK_TITLE_CHARS} characters")]
    Title,
    /// The description is too large.
    #[error("description must be at most {MAX_TASK_DESCRIPTION_BYTES} bytes")]
    Description,
    /// Too many labels, or one is malformed.
    #[error(
        "labels: at most {MAX_TASK_LABELS} labels, each a single line of 1 to {MAX_TASK_LABEL_CHARS} characters"
    )]
    Labels,
}

impl TaskContext {
    /// Checks every field; the daemon calls this before selecting anything.
    pub fn validate(&self) -> Result<(), TaskError> {
        if !is_task_id(&self.task_id) {
            return Err(TaskError::TaskId);
        }
        if !is_slug(&self.workspace) {
            return Err(TaskError::Workspace);
        }
        for (name, v) in [
            ("origin_user_id", &self.origin_user_id),
            ("asset_id", &self.asset_id),
            ("project_id", &self.project_id),
        ] {
            if v.as_deref().is_some_and(|v| !is_scope_id(v)) {
                return Err(TaskError::ScopeId(name));
            }
        }
        if self.agent.as_deref().is_some_and(|a| !is_slug(a)) {
            return Err(TaskError::Agent);
        }
        let title_chars = self.title.chars().count();
        if self.title.trim().is_empty()
            || title_chars > MAX_TASK_TITLE_CHARS
            || self.title.chars().any(char::is_control)
        {
            return Err(TaskError::Title);
        }
        if self.description.len() > MAX_TASK_DESCRIPTION_BYTES || self.description.contains('\0') {
            return Err(TaskError::Description);
        }
        if self.labels.len() > MAX_TASK_LABELS
            || self.labels.iter().any(|l| {
                l.trim().is_empty()
                    || l.chars().count() > MAX_TASK_LABEL_CHARS
                    || l.chars().any(char::is_control)
            })
        {
            return Err(TaskError::Labels);
        }
        Ok(())
    }

    /// Who the task is, for the hard exclusions.
    pub fn viewer(&self) -> crate::Viewer<'_> {
        crate::Viewer {
            user: self.origin_user_id.as_deref(),
            asset: self.asset_id.as_deref(),
            project: self.project_id.as_deref(),
            agent: self.agent.as_deref(),
        }
    }

    /// What a store of this task carries as its provenance: the task's own facts, which
    /// its daemon asserts (never the agent).
    pub fn provenance(&self) -> crate::Provenance {
        crate::Provenance {
            task_id: Some(self.task_id.clone()),
            user_id: self.origin_user_id.clone(),
            asset_id: self.asset_id.clone(),
            project_id: self.project_id.clone(),
            agent: self.agent.clone(),
            ..Default::default()
        }
    }

    /// Title, description and labels as one text, for BM25.
    pub fn search_text(&self) -> String {
        let mut text = String::with_capacity(self.title.len() + self.description.len() + 64);
        text.push_str(&self.title);
        text.push('\n');
        text.push_str(&self.description);
        for l in &self.labels {
            text.push('\n');
            text.push_str(l);
        }
        text
    }
}

/// What selection derives from a task once.
#[derive(Debug, Clone)]
pub struct TaskQuery<'a> {
    /// The task.
    pub task: &'a TaskContext,
    /// Canonical error codes found in the title, description and labels.
    pub codes: BTreeSet<String>,
    /// Lowercase labels and words of the title and description, for stack/label matches.
    pub words: HashSet<String>,
}

impl<'a> TaskQuery<'a> {
    /// Derives codes and words from a task.
    pub fn new(task: &'a TaskContext, codes: &CodeExtractor) -> Self {
        let mut found = BTreeSet::new();
        codes.extract_into(&task.title, &mut found);
        codes.extract_into(&task.description, &mut found);
        let mut words = HashSet::new();
        for label in &task.labels {
            codes.extract_into(label, &mut found);
            words.insert(label.trim().to_lowercase());
        }
        for text in [&task.title, &task.description] {
            add_words(text, &mut words);
        }
        TaskQuery {
            task,
            codes: found,
            words,
        }
    }
}

/// Splits on anything but letters, digits and `._-`, trims those marks from the ends (a
/// sentence's final full stop), and lowercases; slugs like `db-prod-01` stay whole.
fn add_words(text: &str, out: &mut HashSet<String>) {
    for raw in text.split(|c: char| !(c.is_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        let word = raw.trim_matches(|c| matches!(c, '.' | '_' | '-'));
        if !word.is_empty() {
            out.insert(word.to_lowercase());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn task(title: &str) -> TaskContext {
        TaskContext {
            task_id: "t-1".into(),
            workspace: "acme".into(),
            origin_user_id: Some("alice".into()),
            asset_id: None,
            project_id: None,
            agent: None,
            title: title.into(),
            description: String::new(),
            labels: vec![],
        }
    }

    #[test]
    fn words_keep_slugs_and_drop_sentence_marks() {
        let mut t = task("Lag on db-prod-01. Check Postgres, then k8s.");
        t.labels = vec!["ETL".into()];
        let q = TaskQuery::new(&t, &CodeExtractor::default());
        for w in ["db-prod-01", "postgres", "k8s", "etl", "lag"] {
            assert!(q.words.contains(w), "{w} missing from {:?}", q.words);
        }
        assert!(!q.words.contains("k8s."));
    }

    #[test]
    fn codes_come_from_title_description_and_labels() {
        let mut t = task("ETL fails with ora-1555");
        t.description = "then ERROR 1205 (HY000)".into();
        t.labels = vec!["http 502".into()];
        let q = TaskQuery::new(&t, &CodeExtractor::default());
        let codes: Vec<_> = q.codes.iter().map(String::as_str).collect();
        assert_eq!(codes, ["ERROR 1205", "HTTP 502", "ORA-01555"]);
    }

    #[test]
    fn validation_names_the_field() {
        assert!(task("ok").validate().is_ok());
        let mut t = task("ok");
        t.task_id = "../x".into();
        assert_eq!(t.validate(), Err(TaskError::TaskId));
        let mut t = task("ok");
        t.workspace = "Acme Corp".into();
        assert_eq!(t.validate(), Err(TaskError::Workspace));
        let mut t = task("ok");
        t.asset_id = Some("".into());
        assert_eq!(t.validate(), Err(TaskError::ScopeId("asset_id")));
        assert_eq!(task("").validate(), Err(TaskError::Title));
        assert_eq!(task(&"x".repeat(1001)).validate(), Err(TaskError::Title));
        let mut t = task("ok");
        t.labels = vec!["a\nb".into()];
        assert_eq!(t.validate(), Err(TaskError::Labels));
    }
}

//! Thresholds and caps of selection and rendering, with the defaults of OKF.md, and the
//! compiled form (`Rules`) that selection runs with.

use serde::{Deserialize, Serialize};

use crate::codes::{CodeExtractor, CodePattern, PatternError, default_code_patterns};

/// Selection and rendering settings. Every field has the OKF.md default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SelectionConfig {
    /// How many BM25 hits may select a card by text alone.
    pub text_candidates: usize,
    /// A text hit must score at least this share of the best hit's score.
    pub min_text_ratio: f32,
    /// Rows in MEMORY.md's recommendations table.
    pub table_rows: usize,
    /// Cards mounted into a task view.
    pub max_mounted: usize,
    /// Days after `last_seen` before importance starts to decay.
    pub decay_grace_days: f64,
    /// Days for decayed importance to halve.
    pub decay_half_life_days: f64,
    /// Decay never takes importance below this.
    pub decay_floor: f64,
    /// Error-code patterns; replaces the built-in list when set.
    pub error_code_patterns: Vec<CodePattern>,
    /// A model2vec embedding model's directory: turns on the dense ranker beside BM25
    /// (README "Hybrid retrieval"). Unset: BM25 alone.
    pub embedding_model: Option<std::path::PathBuf>,
    /// The dense ranker proposes only cards at least this similar (cosine) to the text:
    /// every card has some nearest neighbour, and one below this is noise.
    pub dense_min_similarity: f32,
}

impl Default for SelectionConfig {
    fn default() -> Self {
        SelectionConfig {
            text_candidates: 10,
            min_text_ratio: 0.25,
            table_rows: 10,
            max_mounted: 50,
            decay_grace_days: 30.0,
            decay_half_life_days: 45.0,
            decay_floor: 0.10,
            error_code_patterns: default_code_patterns(),
            embedding_model: None,
            dense_min_similarity: 0.45,
        }
    }
}

/// Why a selection config is refused; each names its key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A number is out of its range.
    #[error("{key}: {rule}")]
    Range {
        /// The key.
        key: &'static str,
        /// The allowed range.
        rule: &'static str,
    },
    /// An error-code pattern does not compile.
    #[error("error_code_patterns: {0}")]
    Pattern(#[from] PatternError),
}

/// A validated config with its patterns compiled.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The settings.
    pub config: SelectionConfig,
    /// The compiled error-code patterns.
    pub codes: CodeExtractor,
}

impl Rules {
    /// Validates a config and compiles its patterns.
    pub fn new(config: SelectionConfig) -> Result<Self, ConfigError> {
        let range = |ok: bool, key, rule| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError::Range { key, rule })
            }
        };
        range(
            (0.0..=1.0).contains(&config.min_text_ratio),
            "min_text_ratio",
            "must be from 0.0 to 1.0",
        )?;
        range(
            config.table_rows <= config.max_mounted,
            "table_rows",
            "must not exceed max_mounted (every table row links to a mounted card)",
        )?;
        range(
            config.decay_grace_days >= 0.0 && config.decay_grace_days.is_finite(),
            "decay_grace_days",
            "must be a number of days, 0 or more",
        )?;
        range(
            config.decay_half_life_days > 0.0 && config.decay_half_life_days.is_finite(),
            "decay_half_life_days",
            "must be a number of days above 0",
        )?;
        range(
            (0.0..=1.0).contains(&config.decay_floor),
            "decay_floor",
            "must be from 0.0 to 1.0",
        )?;
        range(
            (-1.0..=1.0).contains(&config.dense_min_similarity),
            "dense_min_similarity",
            "must be a cosine similarity, from -1.0 to 1.0",
        )?;
        let codes = CodeExtractor::new(&config.error_code_patterns)?;
        Ok(Rules { config, codes })
    }
}

impl Default for Rules {
    fn default() -> Self {
        Rules::new(SelectionConfig::default()).expect("defaults are valid")
    }
}

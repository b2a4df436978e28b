//! The optional dense ranker's two halves: a static embedding model in model2vec format,
//! and the card vectors a generation stores beside its search index.
//!
//! A model2vec model is a directory of three files: `config.json`, `tokenizer.json` (a
//! Hugging Face tokenizer; mop reads SentencePiece Unigram ones, see [`unigram`]) and `model.safetensors` (one row per token, the tensor
//! `embeddings`, optionally per-token `weights` and a token-to-row `mapping`). A text's
//! vector is the mean of its tokens' rows, L2-normalized: no neural network runs, so a
//! card embeds in microseconds on one core and the same text always gives the same vector.
//!
//! Vectors from different models live in different spaces and must never be compared.
//! Every model has a [`Fingerprint`] (its id, dimension and a hash of its files); card
//! vectors record the fingerprint they were made with, and [`CardVectors::read`] hands
//! them out only for the same one. Anything else is the caller's cue to fall back to BM25
//! alone.
//!
//! Vectors are stored quantized to 8 bits with one scale per card (a quarter of the f32
//! size), and a query is quantized the same way, so ranking is integer dot products: exact,
//! and independent of every other card (no answer depends on cards a task cannot see).

mod unigram;

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The card vectors of a generation, quantized.
pub const VECTORS_FILE: &str = "vectors.bin";
/// What [`VECTORS_FILE`] holds: format, fingerprint, count and hash.
pub const VECTORS_META: &str = "vectors.json";
/// Format 2: vectors pooled from the 8-bit token matrix ([`Matrix`]); format 1 vectors
/// (pooled from the file's own values) are rebuilt, not compared with format 2 queries.
const VECTORS_FORMAT: u32 = 2;
/// The model's three files, in the order the fingerprint hashes them.
const MODEL_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];
/// Tokens of a text that count; the rest is ignored (model2vec's default).
const MAX_TOKENS: usize = 512;
/// Bytes of a text that are tokenized at all. A mean of token vectors is as much the
/// gist of a card's first kilobyte (title, description, labels, the body's opening) as of
/// the whole card, and tokenizing is most of the cost of a build's vectors.
const MAX_TEXT_BYTES: usize = 1024;

/// Why a model or a set of card vectors cannot be used. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// A file of the model is missing or unreadable.
    #[error("embedding model {dir}: cannot read {file}: {source}")]
    ModelRead {
        /// The model directory.
        dir: String,
        /// The file.
        file: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// A file of the model is not what model2vec writes.
    #[error("embedding model {dir}: {file}: {problem}")]
    ModelInvalid {
        /// The model directory.
        dir: String,
        /// The file.
        file: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// Stored card vectors are unreadable or damaged.
    #[error("card vectors in {dir}: {problem}")]
    Vectors {
        /// The index directory.
        dir: String,
        /// What is wrong.
        problem: String,
    },
}

/// Which vector space a vector belongs to. Two fingerprints that differ in anything mean
/// two spaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// The model's name: `config.json`'s `model_id` when it has one, else the directory's
    /// name.
    pub model_id: String,
    /// Dimensions of a vector.
    pub dim: usize,
    /// SHA-256 over the model's three files (each name, length and bytes), hex.
    pub sha256: String,
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (dimension {}, files sha256 {})",
            self.model_id,
            self.dim,
            self.sha256.get(..12).unwrap_or(&self.sha256)
        )
    }
}

/// The token embedding matrix, 8 bits a value with one scale per row: a 128k-token,
/// 256-dimension model is 31 MiB in memory this way, 62.5 MiB as the file's f16 and
/// 125 MiB as f32. A text's vector is a mean of hundreds of rows, normalized, so the
/// rows' rounding (under half a percent of each row's largest value) does not show in it.
struct Matrix {
    codes: Vec<i8>,
    scales: Vec<f32>,
}

impl Matrix {
    /// The matrix of `rows` rows of `dim` values, each row handed to `fill` to write as
    /// f32 into the buffer it gets.
    fn quantized(rows: usize, dim: usize, mut fill: impl FnMut(usize, &mut [f32])) -> Matrix {
        let mut codes = vec![0i8; rows * dim];
        let mut scales = Vec::with_capacity(rows);
        let mut row = vec![0f32; dim];
        for (r, out) in codes.chunks_exact_mut(dim).enumerate() {
            fill(r, &mut row);
            scales.push(quantize_into(&row, out));
        }
        Matrix { codes, scales }
    }

    /// Adds `weight` × row `row` to `sum`.
    fn add_row(&self, row: usize, weight: f32, sum: &mut [f32]) {
        let dim = sum.len();
        let factor = weight * self.scales[row];
        sum.iter_mut()
            .zip(&self.codes[row * dim..(row + 1) * dim])
            .for_each(|(s, c)| *s += factor * f32::from(*c));
    }
}

/// A loaded model2vec model.
pub struct Model {
    tokenizer: unigram::Unigram,
    matrix: Matrix,
    rows: usize,
    dim: usize,
    weights: Option<Vec<f32>>,
    mapping: Option<Vec<u32>>,
    fingerprint: Fingerprint,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("fingerprint", &self.fingerprint)
            .field("rows", &self.rows)
            .finish()
    }
}

/// Little-endian f32s, the byte order of safetensors and of [`VECTORS_FILE`].
fn le_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A tensor's elements as f32 (for the small per-token tables).
fn to_f32(view: &safetensors::tensor::TensorView<'_>) -> Option<Vec<f32>> {
    use safetensors::Dtype;
    let d = view.data();
    Some(match view.dtype() {
        Dtype::F32 => le_f32s(d),
        Dtype::F64 => d
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
            .collect(),
        Dtype::F16 => d
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

/// The embedding matrix (`embeddings`, or the names other exporters use): quantized rows
/// from F32, F16 or I8, and its shape.
fn read_embeddings(st: &safetensors::SafeTensors<'_>) -> Result<(Matrix, usize, usize), String> {
    let name = ["embeddings", "0", "embedding.weight"]
        .into_iter()
        .find(|n| st.names().iter().any(|x| x == n))
        .ok_or_else(|| "has no tensor named embeddings".to_owned())?;
    let view = st.tensor(name).expect("listed tensor");
    let [rows, dim] = view.shape() else {
        return Err(format!(
            "tensor {name} has shape {:?}, not [tokens, dimension]",
            view.shape()
        ));
    };
    let (rows, dim) = (*rows, *dim);
    if rows == 0 || dim == 0 {
        return Err(format!("tensor {name} is empty"));
    }
    let d = view.data();
    let matrix = match view.dtype() {
        safetensors::Dtype::F32 => Matrix::quantized(rows, dim, |r, out| {
            for (o, b) in out.iter_mut().zip(d[r * dim * 4..].chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }),
        safetensors::Dtype::F16 => Matrix::quantized(rows, dim, |r, out| {
            for (o, b) in out.iter_mut().zip(d[r * dim * 2..].chunks_exact(2)) {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }),
        safetensors::Dtype::I8 => Matrix::quantized(rows, dim, |r, out| {
            for (o, b) in out.iter_mut().zip(&d[r * dim..(r + 1) * dim]) {
                *o = f32::from(*b as i8);
            }
        }),
        other => {
            return Err(format!(
                "tensor {name} is {other:?}; F32, F16 and I8 are supported"
            ));
        }
    };
    Ok((matrix, rows, dim))
}

/// The optional `mapping` tensor: for each token, its row of the matrix (`rows` of them).
fn read_mapping(
    st: &safetensors::SafeTensors<'_>,
    rows: usize,
) -> Result<Option<Vec<u32>>, String> {
    match st.tensor("mapping") {
        Ok(v) => {
            let d = v.data();
            // A row number that does not fit is out of range like any other.
            let row = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
            let ids: Vec<u32> = match v.dtype() {
                safetensors::Dtype::I64 => d
                    .chunks_exact(8)
                    .map(|b| row(i64::from_le_bytes(b.try_into().expect("8 bytes"))))
                    .collect(),
                safetensors::Dtype::I32 => d
                    .chunks_exact(4)
                    .map(|b| {
                        row(i64::from(i32::from_le_bytes(
                            b.try_into().expect("4 bytes"),
                        )))
                    })
                    .collect(),
                other => {
                    return Err(format!(
                        "tensor mapping is {other:?}, not an integer tensor"
                    ));
                }
            };
            if let Some(bad) = ids.iter().find(|r| **r as usize >= rows) {
                return Err(format!("mapping points at row {bad} of {rows}"));
            }
            Ok(Some(ids))
        }
        Err(_) => Ok(None),
    }
}

impl Model {
    /// Loads the model in `dir` (`config.json`, `tokenizer.json`, `model.safetensors`).
    /// Reads nothing but these files; never fetches anything.
    pub fn load(dir: &Path) -> Result<Model, EmbedError> {
        let shown = dir.display().to_string();
        let invalid = |file, problem: String| EmbedError::ModelInvalid {
            dir: shown.clone(),
            file,
            problem,
        };
        let mut files = Vec::with_capacity(MODEL_FILES.len());
        for file in MODEL_FILES {
            let bytes = std::fs::read(dir.join(file)).map_err(|source| EmbedError::ModelRead {
                dir: shown.clone(),
                file,
                source,
            })?;
            files.push(bytes);
        }
        let [config, tokenizer_json, tensors] = &files[..] else {
            unreachable!("three files were read")
        };
        let config: serde_json::Value = serde_json::from_slice(config)
            .map_err(|e| invalid("config.json", format!("not JSON: {e}")))?;
        // `normalize` in config.json is not read: ranking is by cosine, so every vector
        // is normalized whatever the model's own default.
        let tokenizer = unigram::Unigram::from_json(tokenizer_json)
            .map_err(|problem| invalid("tokenizer.json", problem))?;
        let st = safetensors::SafeTensors::deserialize(tensors)
            .map_err(|e| invalid("model.safetensors", e.to_string()))?;
        let (matrix, rows, dim) =
            read_embeddings(&st).map_err(|problem| invalid("model.safetensors", problem))?;
        let weights = match st.tensor("weights") {
            Ok(v) => Some(to_f32(&v).ok_or_else(|| {
                invalid(
                    "model.safetensors",
                    "tensor weights is not a float tensor".into(),
                )
            })?),
            Err(_) => None,
        };
        let mapping =
            read_mapping(&st, rows).map_err(|problem| invalid("model.safetensors", problem))?;
        let model_id = config
            .get("model_id")
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .or_else(|| {
                std::fs::canonicalize(dir)
                    .ok()?
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "unnamed".into());
        let mut hash = Sha256::new();
        for (name, bytes) in MODEL_FILES.iter().zip(&files) {
            hash.update(name.as_bytes());
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        }
        let sha256 = hex(&hash.finalize());
        Ok(Model {
            tokenizer,
            matrix,
            rows,
            dim,
            weights,
            mapping,
            fingerprint: Fingerprint {
                model_id,
                dim,
                sha256,
            },
        })
    }

    /// The model's fingerprint.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// Dimensions of a vector.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The ids of the tokens of `text` that [`Model::embed`] pools: its first
    /// kilobyte, tokenized, without unknown tokens, at most 512.
    pub fn token_ids(&self, text: &str) -> Vec<u32> {
        let mut end = text.len().min(MAX_TEXT_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mut ids = Vec::with_capacity(end / 3);
        // The tokenizer runs on card and query text that agents write: should it ever
        // panic on some input, that text gets no tokens rather than taking the daemon's
        // build or search down with it.
        let encoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.tokenizer.encode(&text[..end], &mut ids);
        }));
        if encoded.is_err() {
            return Vec::new();
        }
        let unk = self.tokenizer.unk();
        ids.retain(|id| *id != unk);
        ids.truncate(MAX_TOKENS);
        ids
    }

    /// The text's vector, L2-normalized; `None` when no token of it is known to the model
    /// (such a text is near nothing, and must not be ranked as if it were).
    pub fn embed(&self, text: &str) -> Option<Vec<f32>> {
        let mut sum = vec![0f32; self.dim];
        let mut used = 0usize;
        for id in self.token_ids(text) {
            let row = match &self.mapping {
                Some(m) => match m.get(id as usize) {
                    Some(r) => *r as usize,
                    None => continue,
                },
                None => id as usize,
            };
            if row >= self.rows {
                continue;
            }
            let weight = self
                .weights
                .as_ref()
                .and_then(|w| w.get(id as usize).copied())
                .unwrap_or(1.0);
            self.matrix.add_row(row, weight, &mut sum);
            used += 1;
        }
        let norm = sum.iter().map(|x| x * x).sum::<f32>().sqrt();
        if used == 0 || norm == 0.0 || !norm.is_finite() {
            return None;
        }
        sum.iter_mut().for_each(|x| *x /= norm);
        Some(sum)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A vector quantized to 8 bits: `scale × codes` approximates it.
#[derive(Debug, Clone, PartialEq)]
struct Quantized {
    codes: Vec<i8>,
    scale: f32,
}

impl Quantized {
    /// Quantizes a vector (symmetric, one scale).
    fn new(v: &[f32]) -> Quantized {
        let mut codes = vec![0; v.len()];
        let scale = quantize_into(v, &mut codes);
        Quantized { codes, scale }
    }
}

/// Writes `v` as 8-bit codes into `codes` (symmetric: the largest magnitude becomes 127)
/// and returns the scale that turns codes back into values (0 for the zero vector).
fn quantize_into(v: &[f32], codes: &mut [i8]) -> f32 {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if max == 0.0 || !max.is_finite() {
        codes.iter_mut().for_each(|c| *c = 0);
        return 0.0;
    }
    let scale = max / 127.0;
    for (c, x) in codes.iter_mut().zip(v) {
        *c = (x / scale).round() as i8;
    }
    scale
}

/// Integer dot product; exact, so its order of summation cannot change a ranking.
fn dot(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| i32::from(*x) * i32::from(*y))
        .sum()
}

#[derive(Debug, Serialize, Deserialize)]
struct VectorsMeta {
    format: u32,
    fingerprint: Fingerprint,
    count: u32,
    /// SHA-256 of [`VECTORS_FILE`], hex.
    sha256: String,
}

/// Card vectors being computed for a new generation, by card ordinal.
pub struct VectorsBuilder<'m> {
    model: &'m Model,
    codes: Vec<i8>,
    scales: Vec<f32>,
}

impl<'m> VectorsBuilder<'m> {
    /// An empty set for `model`'s space.
    pub fn new(model: &'m Model) -> Self {
        VectorsBuilder {
            model,
            codes: Vec::new(),
            scales: Vec::new(),
        }
    }

    /// Embeds the card with ordinal `ord`. A card whose text the model does not know gets
    /// the zero vector (similar to nothing).
    pub fn add(&mut self, ord: u32, text: &str) {
        let dim = self.model.dim;
        let at = ord as usize;
        if self.scales.len() <= at {
            self.scales.resize(at + 1, 0.0);
            self.codes.resize((at + 1) * dim, 0);
        }
        if let Some(v) = self.model.embed(text) {
            let q = Quantized::new(&v);
            self.codes[at * dim..(at + 1) * dim].copy_from_slice(&q.codes);
            self.scales[at] = q.scale;
        }
    }

    /// Takes the vectors of `later` from ordinal `from` on (the cards another builder
    /// embedded, all at or after `from`).
    pub fn append(&mut self, later: VectorsBuilder<'m>, from: u32) {
        let dim = self.model.dim;
        let from = from as usize;
        if later.scales.len() <= from {
            return;
        }
        self.scales.resize(later.scales.len(), 0.0);
        self.codes.resize(later.scales.len() * dim, 0);
        self.scales[from..].copy_from_slice(&later.scales[from..]);
        self.codes[from * dim..].copy_from_slice(&later.codes[from * dim..]);
    }

    /// Writes the vectors of `count` cards into `dir` (an index directory being built).
    pub fn write(mut self, dir: &Path, count: u32) -> Result<(), EmbedError> {
        let dim = self.model.dim;
        self.scales.resize(count as usize, 0.0);
        self.codes.resize(count as usize * dim, 0);
        let io = |e: std::io::Error| EmbedError::Vectors {
            dir: dir.display().to_string(),
            problem: e.to_string(),
        };
        let mut bytes = Vec::with_capacity(self.codes.len() + 4 * self.scales.len());
        bytes.extend(self.codes.iter().map(|c| *c as u8));
        for s in &self.scales {
            bytes.extend(s.to_le_bytes());
        }
        let meta = VectorsMeta {
            format: VECTORS_FORMAT,
            fingerprint: self.model.fingerprint.clone(),
            count,
            sha256: hex(&Sha256::digest(&bytes)),
        };
        let mut file = std::fs::File::create(dir.join(VECTORS_FILE)).map_err(io)?;
        file.write_all(&bytes).map_err(io)?;
        let meta = serde_json::to_vec(&meta).expect("meta serializes");
        std::fs::write(dir.join(VECTORS_META), meta).map_err(io)?;
        Ok(())
    }
}

/// Why stored card vectors are not used for a model; each is a reason to rank by BM25
/// alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// The generation was built without a model.
    Absent,
    /// Built by another model (or other files of it).
    Fingerprint {
        /// What the vectors were made with.
        stored: Fingerprint,
    },
    /// The vectors' dimension is not the model's.
    Dimension {
        /// The vectors' dimension.
        stored: usize,
        /// The model's.
        model: usize,
    },
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::Absent => write!(f, "the generation has no card vectors"),
            Mismatch::Fingerprint { stored } => {
                write!(f, "the card vectors were made by another model: {stored}")
            }
            Mismatch::Dimension { stored, model } => write!(
                f,
                "the card vectors have dimension {stored} but the model's is {model}"
            ),
        }
    }
}

/// The fingerprint of the vectors stored in `dir`, if any are and their description is
/// readable (a quick check that reads only [`VECTORS_META`]).
pub fn stored_fingerprint(dir: &Path) -> Option<Fingerprint> {
    read_meta(dir).ok().flatten().map(|m| m.fingerprint)
}

/// True when the vectors in `dir` are whole and were made by `model`: what a search would
/// use (the full check of [`CardVectors::read`], for the cards the file says it holds).
pub fn usable(dir: &Path, model: &Model) -> bool {
    match read_meta(dir) {
        Ok(Some(meta)) => matches!(CardVectors::read(dir, model, meta.count), Ok(Ok(_))),
        _ => false,
    }
}

/// Most bytes a [`VECTORS_META`] may have: it holds a few short fields.
const MAX_META_BYTES: u64 = 64 * 1024;

/// The description of the vectors in `dir`: `None` when there is none, `Err` when it is
/// unreadable or malformed.
fn read_meta(dir: &Path) -> Result<Option<VectorsMeta>, String> {
    use std::io::Read;
    let file = match std::fs::File::open(dir.join(VECTORS_META)) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {VECTORS_META}: {e}")),
    };
    let mut bytes = Vec::new();
    file.take(MAX_META_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {VECTORS_META}: {e}"))?;
    if bytes.len() as u64 > MAX_META_BYTES {
        return Err(format!(
            "{VECTORS_META} is larger than {MAX_META_BYTES} bytes"
        ));
    }
    let meta: VectorsMeta =
        serde_json::from_slice(&bytes).map_err(|e| format!("{VECTORS_META} is unreadable: {e}"))?;
    let hex64 = |h: &str| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex64(&meta.sha256) || !hex64(&meta.fingerprint.sha256) {
        return Err(format!("{VECTORS_META} holds a malformed hash"));
    }
    Ok(Some(meta))
}

/// A generation's card vectors, checked against the model that will rank with them.
#[derive(Debug)]
pub struct CardVectors {
    dim: usize,
    codes: Vec<i8>,
    scales: Vec<f32>,
}

impl CardVectors {
    /// Reads the vectors in `dir` for `model`: `Ok(Err(_))` when there are none or they
    /// belong to another vector space (the caller ranks by BM25 alone), `Err` when they
    /// are damaged.
    pub fn read(
        dir: &Path,
        model: &Model,
        cards: u32,
    ) -> Result<Result<CardVectors, Mismatch>, EmbedError> {
        let shown = dir.display().to_string();
        let bad = |problem: String| EmbedError::Vectors {
            dir: shown.clone(),
            problem,
        };
        let meta = match read_meta(dir) {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(Err(Mismatch::Absent)),
            Err(problem) => return Err(bad(problem)),
        };
        if meta.format != VECTORS_FORMAT {
            return Err(bad(format!(
                "{VECTORS_META} has format {}; this build reads {VECTORS_FORMAT}",
                meta.format
            )));
        }
        // The dimension is checked first and on its own: a query of the wrong length
        // must never reach the ranking.
        if meta.fingerprint.dim != model.dim {
            return Ok(Err(Mismatch::Dimension {
                stored: meta.fingerprint.dim,
                model: model.dim,
            }));
        }
        if meta.fingerprint != model.fingerprint {
            return Ok(Err(Mismatch::Fingerprint {
                stored: meta.fingerprint,
            }));
        }
        if meta.count != cards {
            return Err(bad(format!(
                "{VECTORS_META} holds {} cards but the generation has {cards}",
                meta.count
            )));
        }
        let dim = meta.fingerprint.dim;
        let expected = cards as usize * (dim + 4);
        // The size first: a file far larger than its cards need is damage, and reading
        // it whole could exhaust memory.
        let size = std::fs::metadata(dir.join(VECTORS_FILE))
            .map_err(|e| bad(format!("cannot read {VECTORS_FILE}: {e}")))?
            .len();
        if size != expected as u64 {
            return Err(bad(format!(
                "{VECTORS_FILE} is {size} bytes; {cards} cards of dimension {dim} take {expected}"
            )));
        }
        let bytes = std::fs::read(dir.join(VECTORS_FILE))
            .map_err(|e| bad(format!("cannot read {VECTORS_FILE}: {e}")))?;
        if bytes.len() != expected {
            return Err(bad(format!(
                "{VECTORS_FILE} is {} bytes; {cards} cards of dimension {dim} take {expected}",
                bytes.len()
            )));
        }
        if hex(&Sha256::digest(&bytes)) != meta.sha256 {
            return Err(bad(format!(
                "{VECTORS_FILE} does not match the hash in {VECTORS_META}"
            )));
        }
        let (codes, scales) = bytes.split_at(cards as usize * dim);
        Ok(Ok(CardVectors {
            dim,
            codes: codes.iter().map(|b| *b as i8).collect(),
            scales: le_f32s(scales),
        }))
    }

    /// Bytes held in memory.
    pub fn heap_bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len()
    }

    /// The `depth` cards among `candidates` most similar to `query` (a vector of
    /// [`Model::embed`]), at cosine similarity `min_similarity` or more, best first (ties:
    /// lower ordinal first), with their similarity. A query of another dimension finds
    /// nothing.
    pub fn nearest(
        &self,
        query: &[f32],
        candidates: impl Iterator<Item = u32>,
        min_similarity: f32,
        depth: usize,
    ) -> Vec<(u32, f32)> {
        if query.len() != self.dim || depth == 0 {
            return Vec::new();
        }
        let q = Quantized::new(query);
        let mut found: Vec<(u32, f32)> = candidates
            .filter_map(|ord| {
                let at = ord as usize;
                let scale = *self.scales.get(at)?;
                let codes = &self.codes[at * self.dim..(at + 1) * self.dim];
                let sim = dot(&q.codes, codes) as f32 * q.scale * scale;
                (sim >= min_similarity && scale > 0.0).then_some((ord, sim))
            })
            .collect();
        found.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        found.truncate(depth);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_dot_products_approximate_cosine() {
        let a = [0.6f32, 0.8, 0.0];
        let b = [0.8f32, 0.6, 0.0];
        let (qa, qb) = (Quantized::new(&a), Quantized::new(&b));
        let sim = dot(&qa.codes, &qb.codes) as f32 * qa.scale * qb.scale;
        assert!((sim - 0.96).abs() < 0.01, "{sim}");
        assert_eq!(Quantized::new(&[0.0, 0.0]).scale, 0.0);
    }
}

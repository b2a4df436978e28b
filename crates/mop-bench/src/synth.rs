//! Synthetic workspaces that look like real ones: the type mix of a team's memory, many
//! users and assets, error codes from four engines, Zipf-skewed vocabulary (so BM25 sees
//! common and rare words), a few CJK cards, unverified agent cards, disabled and
//! superseded cards, and bodies from 200 B to 8 KiB. Deterministic for a given seed.

use jiff::Timestamp;
use mop_cards::{
    Card, CardId, CardSummary, CardType, Counters, Extra, Manifest, ManifestEntry, Provenance,
    Scope, TaskContext, Trust, render_card,
};

/// splitmix64: tiny, fast, and good enough to make test data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Skewed towards low indexes, roughly Zipf-like.
    pub fn skewed(&mut self, n: usize) -> usize {
        let u = self.unit();
        ((u * u * u) * n as f64) as usize
    }

    fn pick<'a>(&mut self, items: &'a [&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const WORDS: &[&str] = &[
    "database",
    "query",
    "index",
    "replica",
    "primary",
    "timeout",
    "lock",
    "deadlock",
    "backup",
    "restore",
    "migration",
    "schema",
    "table",
    "column",
    "partition",
    "vacuum",
    "analyze",
    "plan",
    "statistics",
    "cache",
    "buffer",
    "memory",
    "disk",
    "latency",
    "throughput",
    "connection",
    "pool",
    "session",
    "transaction",
    "commit",
    "rollback",
    "undo",
    "redo",
    "archive",
    "wal",
    "binlog",
    "snapshot",
    "retention",
    "cluster",
    "node",
    "pod",
    "deployment",
    "ingress",
    "gateway",
    "upstream",
    "certificate",
    "rotation",
    "secret",
    "token",
    "permission",
    "role",
    "grant",
    "user",
    "tenant",
    "invoice",
    "billing",
    "ledger",
    "orders",
    "payment",
    "refund",
    "report",
    "batch",
    "job",
    "cron",
    "scheduler",
    "queue",
    "consumer",
    "producer",
    "topic",
    "offset",
    "lag",
    "retry",
    "backoff",
    "circuit",
    "breaker",
    "health",
    "probe",
    "readiness",
    "liveness",
    "rollout",
    "canary",
    "release",
    "freeze",
    "window",
    "approval",
    "review",
    "incident",
    "postmortem",
    "alert",
    "pager",
    "dashboard",
    "metric",
    "trace",
    "log",
    "audit",
    "compliance",
    "encryption",
    "tls",
    "dns",
    "network",
    "firewall",
    "route",
    "balancer",
    "nginx",
    "proxy",
    "header",
    "request",
    "response",
    "error",
    "failure",
    "crash",
    "restart",
    "upgrade",
    "downgrade",
    "version",
    "patch",
    "kernel",
    "cpu",
    "thread",
    "process",
    "signal",
    "heap",
    "leak",
    "gc",
    "jvm",
    "go",
    "python",
    "rust",
    "java",
    "terraform",
    "ansible",
    "helm",
    "chart",
    "manifest",
    "volume",
    "storage",
    "bucket",
    "object",
    "s3",
    "replication",
    "failover",
    "switchover",
    "standby",
    "dataguard",
    "listener",
    "service",
    "endpoint",
    "contract",
    "api",
    "schema-registry",
    "idempotent",
    "consistency",
    "isolation",
    "serializable",
];

const STACKS: &[&str] = &[
    "oracle",
    "postgres",
    "mysql",
    "redis",
    "kafka",
    "kubernetes",
    "nginx",
    "go",
    "java",
    "python",
    "terraform",
    "ansible",
    "elasticsearch",
    "mongodb",
    "rabbitmq",
    "pgbouncer",
    "haproxy",
    "linux",
    "aws",
    "gcp",
];

const CJK: &[&str] = &[
    "数据库",
    "死锁",
    "超时",
    "备份",
    "恢复",
    "索引",
    "主库",
    "从库",
    "复制",
    "延迟",
    "连接",
    "事务",
    "回滚",
    "变更",
    "发布",
    "告警",
    "文字化け",
    "障害",
    "対応",
    "手順",
    "設定",
];

/// The long tail of a real corpus: table, host, job and config names that appear in a few
/// cards each. Without it every card shares one small vocabulary and BM25 sees no rare
/// terms at all.
fn identifier(rng: &mut Rng, spread: usize) -> String {
    const KINDS: &[&str] = &["tbl", "idx", "svc", "job", "host", "cfg", "team", "queue"];
    format!("{}_{}", rng.pick(KINDS), rng.skewed(spread))
}

fn code(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => format!("ORA-{:05}", rng.skewed(2000) * 7 + 1),
        1 => format!(
            "SQLSTATE {}{}{:03}",
            rng.below(10),
            ["P", "0", "1", "2"][rng.below(4)],
            rng.skewed(500)
        ),
        2 => format!("ERROR {}", 1000 + rng.skewed(3000)),
        _ => format!("HTTP {}", 500 + rng.below(5)),
    }
}

fn words(rng: &mut Rng, min: usize, spread: usize, cjk: bool) -> String {
    words_with(rng, min, spread, cjk, 0)
}

/// `min..min+spread` words; with `tail > 0`, about a third are long-tail identifiers.
fn words_with(rng: &mut Rng, min: usize, spread: usize, cjk: bool, tail: usize) -> String {
    let n = min + rng.below(spread.max(1));
    let mut out = String::new();
    for i in 0..n {
        if i > 0 && !cjk {
            out.push(' ');
        }
        if cjk && rng.chance(0.7) {
            out.push_str(rng.pick(CJK));
        } else {
            if cjk {
                out.push(' ');
            }
            if tail > 0 && rng.chance(0.35) {
                out.push_str(&identifier(rng, tail));
            } else {
                out.push_str(WORDS[rng.skewed(WORDS.len())]);
            }
        }
    }
    out
}

fn id_for(seed: u64, n: usize) -> CardId {
    let mut rng = Rng::new(seed ^ (n as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let hi = rng.next_u64();
    let lo = rng.next_u64();
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&hi.to_be_bytes());
    bytes[8..].copy_from_slice(&lo.to_be_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    CardId::from_uuid(uuid_from(bytes))
}

fn uuid_from(bytes: [u8; 16]) -> mop_cards::Uuid {
    mop_cards::Uuid::from_bytes(bytes)
}

/// How many users and assets a workspace of `cards` cards has.
pub fn population(cards: usize) -> (usize, usize) {
    ((cards / 100).max(5), (cards / 50).max(5))
}

/// One synthetic card.
pub fn card(seed: u64, n: usize, total: usize, now: Timestamp) -> Card {
    let mut rng = Rng::new(seed.wrapping_mul(31).wrapping_add(n as u64));
    let (users, assets) = population(total);
    let card_type = match rng.below(100) {
        0..20 => CardType::Fact,
        20..30 => CardType::Preference,
        30..35 => CardType::HumanCorrection,
        35..65 => CardType::ErrorResolution,
        65..80 => CardType::Pitfall,
        80..90 => CardType::Playbook,
        _ => CardType::ReferenceDoc,
    };
    let scope = match rng.below(10) {
        0..4 => Scope::default(),
        4..7 => Scope {
            asset_id: Some(format!("asset-{}", rng.below(assets))),
            ..Scope::default()
        },
        7..9 => Scope {
            user_id: Some(format!("user-{}", rng.below(users))),
            ..Scope::default()
        },
        _ => Scope {
            user_id: Some(format!("user-{}", rng.below(users))),
            asset_id: Some(format!("asset-{}", rng.below(assets))),
            ..Scope::default()
        },
    };
    let cjk = rng.chance(0.05);
    // Labels: half from the shared vocabulary, half team- or service-specific slugs.
    let mut labels: Vec<String> = (0..1 + rng.below(3))
        .map(|_| {
            if rng.chance(0.5) {
                WORDS[rng.below(WORDS.len())].to_owned()
            } else {
                identifier(&mut rng, total / 20 + 10).replace('_', "-")
            }
        })
        .collect();
    labels.sort();
    labels.dedup();
    let mut stacks: Vec<String> = (0..1 + rng.below(2))
        .map(|_| rng.pick(STACKS).to_owned())
        .collect();
    stacks.sort();
    stacks.dedup();
    let error_codes = if card_type == CardType::ErrorResolution || rng.chance(0.1) {
        vec![code(&mut rng)]
    } else {
        vec![]
    };
    let (trust, provenance) = if rng.chance(0.03) {
        let author = format!("user-{}", rng.below(users));
        (
            Trust::Unverified,
            Some(Provenance {
                task_id: Some(format!("task-{n}")),
                user_id: Some(author),
                ..Default::default()
            }),
        )
    } else {
        (Trust::Verified, None)
    };
    let day = 86_400;
    let created = now.as_second() - (rng.below(400) as i64 + 10) * day;
    let last_seen =
        created + rng.below(((now.as_second() - created) / day) as usize + 1) as i64 * day;
    let body_bytes = 200 + (rng.unit().powi(2) * (8 * 1024 - 200) as f64) as usize;
    let mut body = String::with_capacity(body_bytes + 64);
    while body.len() < body_bytes {
        body.push_str(&words_with(&mut rng, 12, 1, cjk, total * 2));
        body.push_str(".\n");
    }
    let mut title = words(&mut rng, 4, 6, cjk);
    if let Some(c) = error_codes.first() {
        title = format!("{c} {title}");
    }
    title = title.chars().take(200).collect();
    let summary = CardSummary {
        id: id_for(seed, n),
        card_type,
        title,
        description: Some(words(&mut rng, 8, 8, cjk).chars().take(300).collect()),
        labels,
        scope,
        error_codes,
        stacks,
        importance: (rng.below(11) as f64) / 10.0,
        created_at: Timestamp::from_second(created).ok(),
        updated_at: None,
        enabled: !rng.chance(0.01),
        superseded_by: None,
        supersedes: Vec::new(),
        trust,
        provenance,
    };
    Card {
        summary,
        counters: Counters {
            occurrence: 1 + rng.skewed(20) as u64,
            last_seen: Timestamp::from_second(last_seen).ok(),
        },
        extra: Extra::default(),
        body,
    }
}

/// A synthetic workspace of `total` cards, with its manifest.
pub struct Synthetic {
    /// The full manifest.
    pub manifest: Manifest,
    /// The cards, in manifest order.
    pub cards: Vec<Card>,
    /// Total bytes of the card files.
    pub bytes: u64,
}

/// Generates a workspace.
pub fn workspace(seed: u64, total: usize, now: Timestamp) -> Synthetic {
    let mut cards: Vec<Card> = (0..total).map(|n| card(seed, n, total, now)).collect();
    // A few cards superseded by their neighbour, as curation leaves them.
    for n in (0..total.saturating_sub(1)).step_by(97) {
        cards[n].summary.superseded_by = Some(cards[n + 1].summary.id);
    }
    let mut bytes = 0u64;
    let entries = cards
        .iter()
        .map(|c| {
            let raw = render_card(c);
            bytes += raw.len() as u64;
            ManifestEntry::for_card(c, raw.as_bytes())
        })
        .collect();
    Synthetic {
        manifest: Manifest {
            epoch: "7d3f1c2a-6b5e-4f09-8a71-0c9e2d4b6a13".into(),
            revision: 1,
            generated_at: now,
            since: None,
            cards: entries,
            removed: vec![],
            inherited: Vec::new(),
        },
        cards,
        bytes,
    }
}

/// The benchmarks' workspace: `total` cards from `seed`, as of a fixed date, written as
/// OKF files under `<dir>/cards`. Returns the workspace and that directory.
pub fn workspace_in(
    seed: u64,
    total: usize,
    dir: &std::path::Path,
) -> std::io::Result<(Synthetic, std::path::PathBuf)> {
    let now = "2026-11-29T00:00:00Z".parse().expect("a valid timestamp");
    eprintln!("generating {total} cards");
    let ws = workspace(seed, total, now);
    let cards_dir = dir.join("cards");
    write_dir(&ws, &cards_dir)?;
    Ok((ws, cards_dir))
}

/// Writes a workspace as an OKF card directory (for `mop-server import`).
pub fn write_dir(ws: &Synthetic, dir: &std::path::Path) -> std::io::Result<()> {
    for card in &ws.cards {
        let path = dir.join(card.path());
        std::fs::create_dir_all(path.parent().expect("card paths have a directory"))?;
        std::fs::write(path, render_card(card))?;
    }
    Ok(())
}

/// Task contexts of the kind runners send: mostly with a user and an asset, half naming an
/// error code, with ticket-like text.
pub fn tasks(seed: u64, count: usize, total_cards: usize) -> Vec<TaskContext> {
    let mut rng = Rng::new(seed ^ 0x7a5c);
    let (users, assets) = population(total_cards);
    (0..count)
        .map(|i| {
            let cjk = rng.chance(0.05);
            let mut title = words(&mut rng, 5, 6, cjk);
            if rng.chance(0.5) {
                title = format!("{title} fails with {}", code(&mut rng));
            }
            TaskContext {
                task_id: format!("bench-{i}"),
                workspace: "bench".into(),
                origin_user_id: rng
                    .chance(0.8)
                    .then(|| format!("user-{}", rng.below(users))),
                asset_id: rng
                    .chance(0.7)
                    .then(|| format!("asset-{}", rng.below(assets))),
                project_id: None,
                agent: None,
                title,
                description: words_with(&mut rng, 20, 30, cjk, total_cards * 2),
                labels: (0..1 + rng.below(2))
                    .map(|_| rng.pick(STACKS).to_owned())
                    .collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_cards_are_valid_okf_and_deterministic() {
        let now: Timestamp = "2026-11-29T00:00:00Z".parse().unwrap();
        let ws = workspace(7, 300, now);
        for (card, entry) in ws.cards.iter().zip(&ws.manifest.cards) {
            let bytes = render_card(card);
            assert_eq!(entry.size as usize, bytes.len());
            let parsed = mop_cards::parse_card(bytes.as_bytes()).unwrap();
            assert_eq!(parsed.summary.title, card.summary.title);
            entry.validate().unwrap();
        }
        let again = workspace(7, 300, now);
        assert_eq!(again.manifest, ws.manifest);
        let kinds: std::collections::BTreeSet<_> =
            ws.cards.iter().map(|c| c.summary.card_type).collect();
        assert_eq!(kinds.len(), CardType::ALL.len());
        for t in tasks(7, 20, 300) {
            t.validate().unwrap();
        }
    }
}

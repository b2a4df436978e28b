//! A corpus for credential screening: synthetic credentials of many kinds, each in the
//! sentence an agent might store it in, and look-alikes that must pass (ids, digests,
//! error codes, versions, placeholders). Every credential is made from a seeded random
//! generator at run time, so none is real and none is committed.

/// One sample: a name, the kind it must be refused as (`None`: it must pass), and the text.
#[derive(Debug, Clone)]
pub struct Sample {
    /// What it is, for assertion messages.
    pub name: &'static str,
    /// The kind a refusal names; `None` for a look-alike that must pass.
    pub kind: Option<&'static str>,
    /// The text (a card body, or a title when `in_title`).
    pub text: String,
    /// The credential in it (empty for a look-alike): what must never show anywhere.
    pub secret: String,
    /// True when the credential sits in the title.
    pub in_title: bool,
}

struct Gen(fastrand::Rng);

const ALNUM: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const UPPER_B32: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
const HEX: &str = "0123456789abcdef";
const B64: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URLSAFE: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
const DIGITS: &str = "0123456789";

impl Gen {
    fn s(&mut self, alphabet: &str, n: usize) -> String {
        let a: Vec<char> = alphabet.chars().collect();
        (0..n).map(|_| a[self.0.usize(..a.len())]).collect()
    }
}

fn b64url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The credentials: at least 30, of at least 15 kinds. Each text holds exactly one.
pub fn credentials(seed: u64) -> Vec<Sample> {
    let mut g = Gen(fastrand::Rng::with_seed(seed));
    let pem = |g: &mut Gen, label: &str| {
        let lines: Vec<String> = (0..6).map(|_| g.s(B64, 64)).collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----",
            lines.join("\n")
        )
    };
    let jwt = |g: &mut Gen| {
        let head = b64url(br#"{"alg":"HS256","typ":"JWT"}"#);
        let claims = b64url(
            format!(
                r#"{{"sub":"svc-{}","name":"etl bot","iat":1733300000}}"#,
                g.s(DIGITS, 6)
            )
            .as_bytes(),
        );
        let sig: Vec<u8> = (0..32).map(|_| g.0.u8(..)).collect();
        format!("{head}.{claims}.{}", b64url(&sig))
    };
    let mut v = Vec::new();
    // Each sample: its name, kind, the credential, and the text around it ({} marks it).
    let mut add = |name, kind, secret: String, around: &str| {
        v.push(Sample {
            name,
            kind: Some(kind),
            text: around.replacen("{}", &secret, 1),
            secret,
            in_title: false,
        })
    };
    let akid = |g: &mut Gen| format!("AKIA{}", g.s(UPPER_B32, 16));
    let k = akid(&mut g);
    add(
        "aws key id in prose",
        "aws-access-token",
        k,
        "The nightly export used access key {} until it was rotated.",
    );
    let k = akid(&mut g);
    add(
        "aws key id in a shell line",
        "aws-access-token",
        k,
        "Run `export AWS_ACCESS_KEY_ID={}` before the sync.",
    );
    let k = format!("{}{}", g.s(B64, 38), g.s(DIGITS, 2));
    add(
        "aws secret key (ini)",
        "credential-assignment",
        k,
        "Put this in ~/.aws/credentials:\n\n[default]\naws_secret_access_key = {}\n",
    );
    let around = "The deploy key, in case the vault is down:\n\n{}\n";
    let k = pem(&mut g, "RSA PRIVATE KEY");
    add("rsa private key", "private-key", k, around);
    let k = pem(&mut g, "OPENSSH PRIVATE KEY");
    add("openssh private key", "private-key", k, around);
    let k = pem(&mut g, "ENCRYPTED PRIVATE KEY");
    add("encrypted pkcs8 key", "private-key", k, around);
    let k = format!("ghp_{}", g.s(ALNUM, 36));
    add(
        "github classic pat",
        "github-pat",
        k,
        "CI pushes with {} (scope repo).",
    );
    let k = format!("ghp_{}", g.s(ALNUM, 36));
    add(
        "github classic pat 2",
        "github-pat",
        k,
        "If the clone fails, the token {} has expired.",
    );
    let k = format!("github_pat_{}_{}", g.s(ALNUM, 22), g.s(ALNUM, 59));
    add(
        "github fine-grained pat",
        "github-fine-grained-pat",
        k,
        "GITHUB_TOKEN={}",
    );
    let k = format!("gho_{}", g.s(ALNUM, 36));
    add(
        "github oauth token",
        "github-oauth",
        k,
        "The app's oauth token is {}.",
    );
    let k = format!("ghs_{}", g.s(ALNUM, 36));
    add(
        "github app token",
        "github-app-token",
        k,
        "Installation token {} works for an hour.",
    );
    let k = format!("glpat-{}", g.s(URLSAFE, 20));
    add(
        "gitlab pat",
        "gitlab-pat",
        k,
        "The gitlab runner registers with {}.",
    );
    let k = format!(
        "xoxb-{}-{}-{}",
        g.s(DIGITS, 12),
        g.s(DIGITS, 13),
        g.s(ALNUM, 24)
    );
    add(
        "slack bot token",
        "slack-bot-token",
        k,
        "Alerts go through the bot {}.",
    );
    let k = format!(
        "xoxp-{}-{}-{}-{}",
        g.s(DIGITS, 12),
        g.s(DIGITS, 12),
        g.s(DIGITS, 13),
        g.s(HEX, 32)
    );
    add(
        "slack user token",
        "slack-user-token",
        k,
        "Use {} to post as the on-call.",
    );
    let k = format!(
        "https://hooks.slack.com/services/T{}/B{}/{}",
        g.s(UPPER_B32, 8),
        g.s(UPPER_B32, 10),
        g.s(ALNUM, 24)
    );
    add(
        "slack webhook",
        "slack-webhook-url",
        k,
        "Post failures to {}",
    );
    let k = format!("sk_live_{}", g.s(ALNUM, 24));
    add(
        "stripe live key",
        "stripe-access-token",
        k,
        "Billing calls Stripe with {} from the worker.",
    );
    let k = format!("rk_live_{}", g.s(ALNUM, 24));
    add(
        "stripe restricted key",
        "stripe-access-token",
        k,
        "The report job uses {} (read only).",
    );
    let k = jwt(&mut g);
    add(
        "jwt in a header",
        "jwt",
        k,
        "The failing request carried Authorization: Bearer {} and got 403.",
    );
    let k = jwt(&mut g);
    add(
        "jwt alone",
        "jwt",
        k,
        "Session cookie was {} when it broke.",
    );
    let k = format!("AIza{}{}", g.s(URLSAFE, 34), g.s(DIGITS, 1));
    add(
        "google api key",
        "gcp-api-key",
        k,
        "Maps calls use {} in the frontend.",
    );
    let k = format!("npm_{}", g.s(ALNUM, 36));
    add(
        "npm token",
        "npm-access-token",
        k,
        "In .npmrc: //registry.npmjs.org/:_authToken={}",
    );
    let k = format!("SG.{}.{}", g.s(ALNUM, 22), g.s(ALNUM, 43));
    add(
        "sendgrid key",
        "sendgrid-api-token",
        k,
        "Mail goes out with {} on the relay.",
    );
    let k = format!("dop_v1_{}", g.s(HEX, 64));
    add(
        "digitalocean token",
        "digitalocean-pat",
        k,
        "Terraform reads {} for droplets.",
    );
    let k = format!("sk-ant-api03-{}AA", g.s(URLSAFE, 93));
    add(
        "anthropic key",
        "anthropic-api-key",
        k,
        "The eval harness calls the API with {} for scoring.",
    );
    let k = format!("hvs.{}", g.s(URLSAFE, 95));
    add(
        "vault token",
        "vault-service-token",
        k,
        "VAULT_TOKEN={} unlocks the kv store.",
    );
    let k = format!("shpat_{}", g.s(HEX, 32));
    add(
        "shopify token",
        "shopify-access-token",
        k,
        "Shop sync: {} (admin API).",
    );
    let k = format!(
        "hf_{}",
        g.s("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", 34)
    );
    add(
        "huggingface token",
        "huggingface-access-token",
        k,
        "Model pulls need {} on the GPU hosts.",
    );
    let k = format!("{}{}", g.s(ALNUM, 14), g.s(DIGITS, 2));
    add(
        "postgres url",
        "url-password",
        k,
        "DATABASE_URL=postgres://ledger_app:{}@db-prod-01.internal:5432/ledger",
    );
    let k = format!("{}{}", g.s(ALNUM, 10), g.s(DIGITS, 2));
    add(
        "mysql url in prose",
        "url-password",
        k,
        "Connect with mysql://root:{}@10.0.4.17/app, then run the migration.",
    );
    let k = format!("{}{}", g.s(ALNUM, 18), g.s(DIGITS, 2));
    add(
        "https basic auth url",
        "url-password",
        k,
        "The mirror is at https://deploy:{}@git.internal.example/org/repo.git",
    );
    let k = format!("{}{}#", g.s(ALNUM, 16), g.s(DIGITS, 2));
    add(
        "password assignment, quoted",
        "credential-assignment",
        k,
        "In settings.py set DB_PASSWORD = \"{}\" and restart.",
    );
    let k = format!("{}{}", g.s(ALNUM, 18), g.s(DIGITS, 2));
    add(
        "password in yaml",
        "credential-assignment",
        k,
        "database:\n  host: db-prod-01\n  password: {}\n",
    );
    let k = format!("{}{}", g.s(ALNUM, 30), g.s(DIGITS, 2));
    add(
        "client secret",
        "credential-assignment",
        k,
        "oauth:\n  client_secret: {}\n",
    );
    let secret = format!("ghp_{}", g.s(ALNUM, 36));
    v.push(Sample {
        name: "github pat in the title",
        kind: Some("github-pat"),
        text: format!("CI token {secret} expired"),
        secret,
        in_title: true,
    });
    v
}

/// Look-alikes that must pass: at least 30.
pub fn look_alikes(seed: u64) -> Vec<Sample> {
    use sha2::{Digest, Sha256};
    let mut g = Gen(fastrand::Rng::with_seed(seed ^ 0x5eed));
    let uuid = |g: &mut Gen| {
        format!(
            "{}-{}-4{}-8{}-{}",
            g.s(HEX, 8),
            g.s(HEX, 4),
            g.s(HEX, 3),
            g.s(HEX, 3),
            g.s(HEX, 12)
        )
    };
    let sha = |g: &mut Gen| format!("{:x}", Sha256::digest(g.s(ALNUM, 20).as_bytes()));
    let b64 = |s: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    let git = |g: &mut Gen| g.s(HEX, 40);
    let texts: Vec<(&'static str, String)> = vec![
        ("card id", format!("This supersedes card {} (see its history).", uuid(&mut g))),
        ("uuid after key", format!("api_request_id = {}", uuid(&mut g))),
        ("uuid as token id", format!("token_id: {}", uuid(&mut g))),
        ("session uuid", format!("The failing session was {}; its logs are in Loki.", uuid(&mut g))),
        ("sha256 labelled", format!("sha256: {}", sha(&mut g))),
        ("sha256 as cache key", format!("cache key: {}", sha(&mut g))),
        ("sha256 after token", format!("token_hash = {}", sha(&mut g))),
        ("docker digest", format!("Pin the image to registry.internal/etl@sha256:{}", sha(&mut g))),
        ("git object id", format!("Fixed in commit {} upstream.", git(&mut g))),
        ("git id after key", format!("commit_sha: {}", git(&mut g))),
        ("git id after token", format!("token: {}", git(&mut g))),
        ("short git ids", format!("Bisected to {}..{}.", g.s(HEX, 7), g.s(HEX, 7))),
        ("base64 of text", format!("The note, encoded: {}", b64("The quick brown fox jumps over the lazy dog, again and again."))),
        ("base64 of text after secret", format!("secret_note: {}", b64("remember to water the plants on friday"))),
        ("oracle and postgres codes", "ORA-01555 snapshot too old, then SQLSTATE 42P01 and ERROR 1205 (HY000).".into()),
        ("rust and http codes", "Build failed with E0308 and E0599; the proxy said HTTP 503 and errno ENOENT (-2), 0x80070005.".into()),
        ("versions", "Upgrade serde 1.0.219 -> 1.0.228, tokio v1.47.1, rustc 1.95.0, semver 2.0.0-rc.1+build.5.".into()),
        ("version as key", "api_version: 1.0.219-rc.1".into()),
        ("password policy prose", "The password policy needs 12 characters; rotate the secret every 90 days.".into()),
        ("code reading a key", "```rust\nlet key = config.api_key();\nlet token: Option<String> = None;\n```".into()),
        ("env placeholders", "password: ${DB_PASSWORD}\napi_key: <your-api-key-here>".into()),
        ("aws documentation example", "AKIAIOSFODNN7EXAMPLE is the key the AWS docs use.".into()),
        ("urls without a password", "See https://ops@wiki.internal/runbooks and postgres://localhost:5432/ledger.".into()),
        ("url with a placeholder password", "DATABASE_URL=postgres://app:${DB_PASSWORD}@db-prod-01/ledger".into()),
        ("max tokens", "Set max_tokens: 4096 and temperature 0.2 for the summariser.".into()),
        ("kubernetes secret ref", "env:\n  - name: DB_PASSWORD\n    valueFrom:\n      secretKeyRef:\n        name: ledger-db\n        key: password".into()),
        ("timestamps and addresses", "At 2026-12-04T08:15:30Z host 10.0.4.17 (mac 52:54:00:12:34:56) dropped off.".into()),
        ("ulid", "Job 01HZX3K8Q9V2M4N6P8R0T2W4Y6 retried three times.".into()),
        ("secret word in prose", "The secret to a fast ETL is sorting by primary key before the merge.".into()),
        ("keyboard words", "Press the key combination Ctrl+Alt+T; the key_id column is an integer.".into()),
        ("hex colour and ids", "Theme colour #1f6feb, ticket OPS-20931, build 20261204.7.".into()),
        ("short password example", "password: changeme is what the vendor ships; change it at install.".into()),
    ];
    texts
        .into_iter()
        .map(|(name, text)| Sample {
            name,
            kind: None,
            text,
            secret: String::new(),
            in_title: false,
        })
        .collect()
}

//! Rendering a card back to OKF v1 text: known keys in the order OKF.md lists them, defaults
//! left out, unknown keys after them in their original order, then the body verbatim.
//! `parse_card(render_card(c)) == c` for every valid card.

use yaml_rust2::yaml::Hash;
use yaml_rust2::{Yaml, YamlEmitter};

use crate::card::{Card, DEFAULT_IMPORTANCE, Trust};

/// Renders a card as an OKF v1 file.
pub fn render_card(card: &Card) -> String {
    let mut out = String::with_capacity(card.body.len() + 512);
    out.push_str("---\n");
    out.push_str(&frontmatter(card));
    out.push_str("---\n");
    out.push_str(&card.body);
    out
}

/// The frontmatter block as `render_card` writes it between its two `---` lines, ending in a
/// newline. `Card::validate` bounds its size, so every valid card renders to a file that
/// parses again, whatever quoting its unknown keys need.
pub(crate) fn frontmatter(card: &Card) -> String {
    let s = &card.summary;
    let mut map = Hash::new();
    let mut put = |k: &str, v: Yaml| {
        map.insert(Yaml::String(k.to_owned()), v);
    };
    let string = |v: &str| Yaml::String(v.to_owned());
    let list = |v: &[String]| Yaml::Array(v.iter().map(|x| string(x)).collect());
    let pairs = |v: &[(&str, &Option<String>)]| {
        let mut h = Hash::new();
        for (k, val) in v {
            if let Some(val) = val {
                h.insert(string(k), string(val));
            }
        }
        Yaml::Hash(h)
    };

    put("id", string(&s.id.to_string()));
    put("type", string(s.card_type.as_str()));
    put("title", string(&s.title));
    if let Some(d) = &s.description {
        put("description", string(d));
    }
    if !s.labels.is_empty() {
        put("labels", list(&s.labels));
    }
    if !s.scope.is_workspace() {
        put(
            "scope",
            pairs(&[
                ("user_id", &s.scope.user_id),
                ("asset_id", &s.scope.asset_id),
                ("project_id", &s.scope.project_id),
                ("agent", &s.scope.agent),
            ]),
        );
    }
    if !s.error_codes.is_empty() {
        put("error_codes", list(&s.error_codes));
    }
    if !s.stacks.is_empty() {
        put("stacks", list(&s.stacks));
    }
    if s.importance != DEFAULT_IMPORTANCE {
        // `{:?}` keeps a decimal point (1.0, not 1), so the value stays a YAML float.
        put("importance", Yaml::Real(format!("{:?}", s.importance)));
    }
    if card.counters.occurrence != 1 {
        put("occurrence", Yaml::Integer(card.counters.occurrence as i64));
    }
    if let Some(t) = s.created_at {
        put("created_at", string(&t.to_string()));
    }
    if let Some(t) = s.updated_at {
        put("updated_at", string(&t.to_string()));
    }
    if let Some(t) = card.counters.last_seen
        && Some(t) != s.created_at
    {
        put("last_seen", string(&t.to_string()));
    }
    if !s.enabled {
        put("enabled", Yaml::Boolean(false));
    }
    if let Some(id) = s.superseded_by {
        put("superseded_by", string(&id.to_string()));
    }
    if !s.supersedes.is_empty() {
        let ids: Vec<String> = s.supersedes.iter().map(ToString::to_string).collect();
        put("supersedes", list(&ids));
    }
    if s.trust != Trust::Verified {
        put("trust", string(s.trust.as_str()));
    }
    if let Some(p) = &s.provenance {
        put(
            "provenance",
            pairs(&[
                ("task_id", &p.task_id),
                ("user_id", &p.user_id),
                ("asset_id", &p.asset_id),
                ("project_id", &p.project_id),
                ("agent", &p.agent),
                ("imported_by", &p.imported_by),
                ("imported_from", &p.imported_from),
            ]),
        );
    }
    for (k, v) in &card.extra.0 {
        map.insert(k.clone(), v.clone());
    }

    let mut out = String::with_capacity(512);
    YamlEmitter::new(&mut out)
        .dump(&Yaml::Hash(map))
        .expect("emitting YAML into a String cannot fail");
    // The emitter opens with its own `---` line; the file's opening line is written above.
    let mut yaml = out.split_off(out.find('\n').map_or(0, |i| i + 1));
    yaml.push('\n');
    yaml
}

//! Characters that change how card text reads without being seen. Agents write cards, so a
//! person reviewing one (in a terminal or a browser) must see these marked, never obeyed.

/// Whether a character could change how text reads without being seen: control characters
/// (terminal escape sequences among them), bidirectional overrides and isolates, zero-width
/// and other invisible format characters, line and paragraph separators, and the Unicode
/// tag characters (which can spell out a whole hidden sentence).
pub fn is_hidden_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{E0000}'..='\u{E007F}'
        )
}

/// Multi-line text with every hidden character except line feeds and tabs shown as a
/// visible `⟨U+XXXX⟩` marker; also returns how many there were.
pub fn reveal_hidden(s: &str) -> (std::borrow::Cow<'_, str>, usize) {
    let hidden = |c: char| c != '\n' && c != '\t' && is_hidden_char(c);
    let count = s.chars().filter(|&c| hidden(c)).count();
    if count == 0 {
        return (std::borrow::Cow::Borrowed(s), 0);
    }
    let mut out = String::with_capacity(s.len() + count * 8);
    for c in s.chars() {
        if hidden(c) {
            out.push_str(&format!("⟨U+{:04X}⟩", c as u32));
        } else {
            out.push(c);
        }
    }
    (std::borrow::Cow::Owned(out), count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_characters_are_marked_and_counted() {
        let (shown, n) = reveal_hidden("a\u{202E}b\u{200B}c\u{E0041}\nnext\tline");
        assert_eq!(shown, "a⟨U+202E⟩b⟨U+200B⟩c⟨U+E0041⟩\nnext\tline");
        assert_eq!(n, 3);
        assert_eq!(reveal_hidden("plain").1, 0);
        assert!(is_hidden_char('\u{1b}') && is_hidden_char('\n') && !is_hidden_char('é'));
    }
}

//! Characters that change how card text reads without being seen. Agents write cards, so a
//! person reviewing one (in a terminal or a browser) must see these marked, never obeyed.

/// Whether a character could change how text reads without being seen: control characters
/// (terminal escape sequences among them), bidirectional overrides and isolates, line and
/// paragraph separators, interlinear annotation marks, the Braille pattern blank (a
/// character that draws nothing, so it can pad text out of view), and every
/// default-ignorable code point: zero-width and joiner characters, Hangul fillers,
/// variation selectors (the emoji ones too: a run of them hides a message as well as tag
/// characters do), and the Unicode tag characters, which can spell out a whole sentence.
pub fn is_hidden_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{FFF9}'..='\u{FFFB}' | '\u{2800}'
        )
        || is_default_ignorable(c)
}

/// Unicode's `Default_Ignorable_Code_Point` (DerivedCoreProperties.txt, Unicode 15.1):
/// characters a renderer shows as nothing. A text with them taken out reads as the text
/// with them in, which is how the credential screen reads a card.
pub fn is_default_ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFF8}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
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

/// One line of card text (a title, a description) as an agent is shown it in a list: each
/// hidden character, line breaks included, as a visible `⟨U+XXXX⟩` marker, runs of
/// whitespace as one space. Why: a listing appends marks such as "(unverified)" to card
/// text, and a title padded with spaces, or reordered by a bidirectional override, could
/// otherwise imitate or push aside the marks the listing gives it.
pub fn one_line_for_agent(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut space = false;
    for c in s.trim().chars() {
        if c == ' ' || (c.is_whitespace() && !is_hidden_char(c)) {
            space = true;
            continue;
        }
        if std::mem::take(&mut space) {
            out.push(' ');
        }
        if is_hidden_char(c) {
            out.push_str(&format!("⟨U+{:04X}⟩", c as u32));
        } else {
            out.push(c);
        }
    }
    out
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
        // Invisible joiners, fillers and selectors of every kind are marked, and so is the
        // Braille blank (not ignorable, but it draws nothing).
        for c in [
            '\u{034F}',
            '\u{180B}',
            '\u{3164}',
            '\u{FFA0}',
            '\u{115F}',
            '\u{1D173}',
            '\u{E0100}',
            '\u{FE0F}',
        ] {
            assert!(
                is_hidden_char(c) && is_default_ignorable(c),
                "U+{:04X}",
                c as u32
            );
        }
        assert!(is_hidden_char('\u{2800}') && !is_default_ignorable('\u{2800}'));
    }

    #[test]
    fn agent_listings_see_hidden_characters_and_no_padding() {
        assert_eq!(
            one_line_for_agent("Fix\u{202E}  it \u{E0041}\n    (verified, mounted)"),
            "Fix⟨U+202E⟩ it ⟨U+E0041⟩⟨U+000A⟩ (verified, mounted)"
        );
        assert_eq!(one_line_for_agent("  plain title "), "plain title");
        assert!(!is_hidden_char('\u{2801}') && !is_hidden_char('\u{00A0}'));
    }
}

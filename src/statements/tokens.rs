//! The tokens of one statement, and the small readers the analysis walks them with.

/// A token of a statement: keywords and unquoted identifiers are lower-cased, quoted
/// identifiers kept as written, string literals and punctuation abstracted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Token {
    Word(String),
    Quoted(String),
    Literal,
    Punct(char),
}

/// Where the comment that starts at `i` ends: after a `/* */` block (nested blocks included)
/// or at the newline that ends a `--` line; None when no comment starts there. An unclosed
/// comment runs to the end.
pub(super) fn comment_end(chars: &[char], i: usize) -> Option<usize> {
    let starts =
        |a: char, b: char, at: usize| chars.get(at) == Some(&a) && chars.get(at + 1) == Some(&b);
    if starts('-', '-', i) {
        return Some(
            chars[i..]
                .iter()
                .position(|&c| c == '\n')
                .map_or(chars.len(), |p| i + p),
        );
    }
    if !starts('/', '*', i) {
        return None;
    }
    let (mut at, mut depth) = (i, 0);
    while at < chars.len() {
        if starts('/', '*', at) {
            depth += 1;
            at += 2;
        } else if starts('*', '/', at) {
            depth -= 1;
            at += 2;
            if depth == 0 {
                return Some(at);
            }
        } else {
            at += 1;
        }
    }
    Some(chars.len())
}

pub(super) fn tokenize(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if let Some(end) = comment_end(&chars, i) {
            i = end;
        } else if c == '"' {
            let mut s = String::new();
            i += 1;
            while i < chars.len() {
                if chars[i] == '"' {
                    if chars.get(i + 1) == Some(&'"') {
                        s.push('"');
                        i += 2;
                        continue;
                    }
                    i += 1;
                    break;
                }
                s.push(chars[i]);
                i += 1;
            }
            out.push(Token::Quoted(s));
        } else if c == '\'' {
            i += 1;
            while i < chars.len() {
                if chars[i] == '\'' {
                    if chars.get(i + 1) == Some(&'\'') {
                        i += 2;
                        continue;
                    }
                    i += 1;
                    break;
                }
                i += 1;
            }
            out.push(Token::Literal);
        } else if c.is_alphanumeric() || c == '_' {
            let mut s = String::new();
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '$')
            {
                s.push(chars[i]);
                i += 1;
            }
            out.push(Token::Word(s.to_lowercase()));
        } else {
            out.push(Token::Punct(c));
            i += 1;
        }
    }
    out
}

pub(super) fn is_word(t: Option<&Token>, w: &str) -> bool {
    matches!(t, Some(Token::Word(x)) if x == w)
}

/// Reads a possibly schema-qualified name at `tokens[i]`, returning it and the next index.
pub(super) fn read_name(tokens: &[Token], mut i: usize) -> Option<(String, usize)> {
    let mut parts = Vec::new();
    loop {
        match tokens.get(i)? {
            Token::Word(w) => parts.push(w.clone()),
            Token::Quoted(q) => parts.push(q.clone()),
            _ => return None,
        }
        i += 1;
        if tokens.get(i) == Some(&Token::Punct('.')) {
            i += 1;
        } else {
            return Some((parts.join("."), i));
        }
    }
}

/// Skips optional keywords (`IF NOT EXISTS`, `ONLY`, `CONCURRENTLY`, ...) at `i`.
pub(super) fn skip_words(tokens: &[Token], mut i: usize, words: &[&str]) -> usize {
    while words.iter().any(|w| is_word(tokens.get(i), w)) {
        i += 1;
    }
    i
}

/// The relations named right after each run of the words `after` in the statement (`REFERENCES
/// parent`, `PARTITION OF parent`).
pub(super) fn named_after(tokens: &[Token], after: &[&str]) -> Vec<String> {
    (0..tokens.len())
        .filter(|&i| {
            after
                .iter()
                .enumerate()
                .all(|(k, w)| is_word(tokens.get(i + k), w))
        })
        .filter_map(|i| read_name(tokens, i + after.len()).map(|(n, _)| n))
        .collect()
}

/// The comma-separated actions of an `ALTER TABLE`, split outside parentheses.
pub(super) fn top_level_actions(tokens: &[Token]) -> Vec<&[Token]> {
    let mut actions = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, t) in tokens.iter().enumerate() {
        match t {
            Token::Punct('(') => depth += 1,
            Token::Punct(')') => depth -= 1,
            Token::Punct(',') if depth == 0 => {
                actions.push(&tokens[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    actions.push(&tokens[start..]);
    actions.retain(|a| !a.is_empty());
    actions
}

//! A multiple-choice arithmetic quiz the project generates itself: the dataset for `inferscope
//! eval` demos and tests, and the simulator's way of answering it (right, except for the
//! profile's `answer_error_rate`). Items are MMLU-shaped: question, four choices, answer letter.

use super::Rng;
use serde::{Deserialize, Serialize};

/// One multiple-choice item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// The question.
    pub question: String,
    /// The choices, in letter order (A, B, C, D).
    pub choices: Vec<String>,
    /// The correct letter.
    pub answer: String,
}

const LETTERS: [char; 4] = ['A', 'B', 'C', 'D'];

/// `n` items, the same for the same seed.
pub fn generate(n: usize, seed: u64) -> Vec<Item> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let (a, b) = (rng.range(10, 99), rng.range(10, 99));
            let sum = a + b;
            let right = rng.range(0, 3) as usize;
            let mut used = vec![sum];
            let choices = (0..4)
                .map(|i| {
                    if i == right {
                        return sum.to_string();
                    }
                    loop {
                        let wrong = sum + rng.range(1, 20) - 10;
                        if !used.contains(&wrong) {
                            used.push(wrong);
                            return wrong.to_string();
                        }
                    }
                })
                .collect();
            Item {
                question: format!("What is {a} + {b}?"),
                choices,
                answer: LETTERS[right].to_string(),
            }
        })
        .collect()
}

/// The prompt an item is asked with.
pub fn prompt(question: &str, choices: &[String]) -> String {
    let mut p = format!("{question}\n");
    for (l, c) in LETTERS.iter().zip(choices) {
        p.push_str(&format!("{l}) {c}\n"));
    }
    p.push_str("Answer with the letter only.");
    p
}

/// The correct letter for a quiz prompt, if `text` is one: its last "What is A + B?" question
/// (a few-shot prompt shows solved ones first), whose choices follow as `A) x` or MMLU's `A. x`.
pub fn solve(text: &str) -> Option<char> {
    let q = text
        .rsplit("What is ")
        .next()
        .filter(|_| text.contains("What is "))?;
    let (a, rest) = q.split_once(" + ")?;
    let b = rest.split('?').next()?;
    let sum = a.trim().parse::<u32>().ok()? + b.trim().parse::<u32>().ok()?;
    q.lines().find_map(|l| {
        let l = l.trim();
        let mut c = l.chars();
        let (letter, sep) = (c.next()?, c.next()?);
        let value = c.as_str();
        (LETTERS.contains(&letter)
            && matches!(sep, ')' | '.')
            && value.trim().parse::<u32>().ok()? == sum)
            .then_some(letter)
    })
}

/// The answer to a word problem of the kind the test fixtures pose (GSM8K-shaped: "… How
/// many …?"): the sum of the numbers in its last question. The simulator's one rule of arithmetic
/// reasoning; `None` for any other text.
pub fn solve_sum(text: &str) -> Option<u64> {
    let q = text.rsplit("Question:").next()?;
    let q = q.split("Answer:").next()?;
    if !q.contains("How many") {
        return None;
    }
    let numbers: Vec<u64> = q
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    (numbers.len() >= 2).then(|| numbers.iter().sum())
}

/// The body of a function of the kind the test fixtures pose (HumanEval-shaped: a signature
/// and a docstring saying "Return x plus 3." — or minus, or times): right, and wrong by one. The
/// simulator's one rule of programming; `None` for any other text.
pub fn solve_code(text: &str) -> Option<(String, String)> {
    let def = text
        .rsplit("\ndef ")
        .next()
        .filter(|_| text.contains("def "))?;
    let doc = def.split("Return ").nth(1)?;
    let sentence = doc.split('.').next()?;
    let mut words = sentence.split_whitespace();
    let (arg, op, n) = (words.next()?, words.next()?, words.next()?);
    let n: i64 = n.parse().ok()?;
    if !arg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || words.next().is_some() {
        return None;
    }
    let op = match op {
        "plus" => "+",
        "minus" => "-",
        "times" => "*",
        _ => return None,
    };
    Some((
        format!("    return {arg} {op} {n}\n"),
        format!("    return {arg} {op} {n} + 1\n"),
    ))
}

/// A wrong letter, chosen with `rng`.
pub fn wrong(right: char, rng: &mut Rng) -> char {
    let others: Vec<char> = LETTERS.iter().copied().filter(|l| *l != right).collect();
    others[(rng.next_u64() % others.len() as u64) as usize]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn generated_items_are_solvable_and_stable() {
        let items = generate(50, 7);
        assert_eq!(items, generate(50, 7));
        for it in &items {
            let p = prompt(&it.question, &it.choices);
            assert_eq!(solve(&p).map(String::from), Some(it.answer.clone()), "{p}");
        }
        assert_eq!(solve("hello"), None);
        let task = "def add_3(x: int) -> int:\n    \"\"\"Return x plus 3.\n    >>> add_3(1)\n    4\n    \"\"\"\n";
        let (right, wrong) = solve_code(task).unwrap();
        assert_eq!(
            (right.as_str(), wrong.as_str()),
            ("    return x + 3\n", "    return x + 3 + 1\n")
        );
        assert_eq!(
            solve_code("def f(s):\n    \"\"\"Return the reverse of s.\"\"\"\n"),
            None
        );
        // MMLU's layout, after a solved example.
        let few_shot = "What is 1 + 2?\nA. 3\nB. 4\nC. 5\nD. 6\nAnswer: A\n\nWhat is 10 + 20?\nA. 3\nB. 31\nC. 30\nD. 29\nAnswer:";
        assert_eq!(solve(few_shot), Some('C'));
    }

    #[test]
    fn word_problems_are_summed() {
        let p = "Question: Ana has 12 shells and finds 30 more. How many shells does she have?\nAnswer:";
        assert_eq!(solve_sum(p), Some(42));
        assert_eq!(
            solve_sum("Question: What is the capital of France?\nAnswer:"),
            None
        );
    }
}

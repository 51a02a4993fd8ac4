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

/// The correct letter for a quiz prompt, if `text` is one.
pub fn solve(text: &str) -> Option<char> {
    let q = text.split("What is ").nth(1)?;
    let (a, rest) = q.split_once(" + ")?;
    let b = rest.split('?').next()?;
    let sum = a.trim().parse::<u32>().ok()? + b.trim().parse::<u32>().ok()?;
    text.lines().find_map(|l| {
        let (letter, value) = l.split_once(") ")?;
        let letter = letter.trim().chars().next()?;
        (LETTERS.contains(&letter) && value.trim().parse::<u32>().ok()? == sum).then_some(letter)
    })
}

/// A wrong letter, chosen with `rng`.
pub fn wrong(right: char, rng: &mut Rng) -> char {
    let others: Vec<char> = LETTERS.iter().copied().filter(|l| *l != right).collect();
    others[(rng.next_u64() % others.len() as u64) as usize]
}

#[cfg(test)]
mod tests {
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
    }
}

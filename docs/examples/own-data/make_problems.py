"""Writes problems.csv: a team's word problems with numeric answers (this example's stand-in for
your own file). Deterministic: the same file every time."""

import csv
import random

NAMES = ["Ann", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Ida"]
ITEMS = ["pens", "cups", "keys", "hats", "maps", "jars"]
TEMPLATES = [  # (question, answer)
    ("{n} has {a} {i} and buys {b} more. How many {i}?", lambda a, b: a + b),
    ("{n} had {a} {i} and lost {b}. How many {i} now?", lambda a, b: a - b),
    ("A box holds {a} {i}; {n} adds {b}. How many {i}?", lambda a, b: a + b),
]

rng = random.Random(0)
rows, seen = [], set()
while len(rows) < 3000:
    question, answer = rng.choice(TEMPLATES)
    a, b = rng.randint(10, 59), rng.randint(1, 9)
    text = question.format(n=rng.choice(NAMES), i=rng.choice(ITEMS), a=a, b=b)
    if text not in seen:
        seen.add(text)
        rows.append({"question": text, "answer": answer(a, b)})
with open("problems.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, ["question", "answer"])
    writer.writeheader()
    writer.writerows(rows)
print(f"problems.csv: {len(rows)} rows")

"""Short Python functions to write, generated: the ``builtin:python_functions`` taskset.

Each task is a function's signature and docstring (``code_prompt``, HumanEval's form: a sentence
saying what it returns and one ``>>>`` example) whose body the model writes; its tests are
HumanEval's form too, ``def check(candidate):`` with an ``assert candidate(...) == ...`` per case
and ``check(<entry_point>)`` after it, the cases drawn at random and their expected values computed
here by the reference body. The gold answer is the function with that body, in a fenced block, as
an instruct model answers (the code reward takes a fenced block that defines the entry point as the
program); the warm start's demonstrations are these answers.

A family is one kind of function (add a constant, reverse a string, keep the elements above a
bound, …) with its parameters drawn per task; the same family with other parameters is another
task, so a held-out split of distinct tasks holds families seen in training with constants that
were not. ``params.families`` picks families by name (default: all of ``FAMILIES``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

CASES = 4  # asserts per task
MORE_CASES = 200  # cases of ``more_cases``: what a task's four let through, these catch
_WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "candle", "garden", "rocket", "silver",
          "forest", "window", "pepper", "marble", "yellow", "banana", "orange", "summer", "winter"]
_NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


@dataclass(frozen=True)
class Family:
    """A kind of function: ``make(rng)`` draws its parameters and returns (name, signature, doc, body,
    reference function, input maker); the input maker draws one call's arguments as a tuple."""

    name: str
    make: Callable[[random.Random], tuple[str, str, str, str, Callable, Callable[[random.Random], tuple]]]


def _ints(rng: random.Random, n: int = 1, low: int = -20, high: int = 50) -> tuple:
    return tuple(rng.randint(low, high) for _ in range(n))


def _int_list(rng: random.Random) -> tuple:
    return ([rng.randint(-9, 30) for _ in range(rng.randint(1, 6))],)


def _word(rng: random.Random) -> tuple:
    return (rng.choice(_WORDS),)


def _add(rng):
    k = rng.randint(2, 99)
    return f"add_{k}", "x: int", f"Return x plus {k}.", f"return x + {k}", lambda x: x + k, _ints


def _times(rng):
    k = rng.randint(2, 12)
    return f"times_{k}", "x: int", f"Return x multiplied by {k}.", f"return x * {k}", lambda x: x * k, _ints


def _minus(rng):
    k = rng.randint(2, 99)
    return f"minus_{k}", "x: int", f"Return x minus {k}.", f"return x - {k}", lambda x: x - k, _ints


def _divisible(rng):
    k = rng.randint(2, 9)
    return (f"divisible_by_{k}", "n: int", f"Return True if n is divisible by {k}, else False.",
            f"return n % {k} == 0", lambda n: n % k == 0, lambda r: (r.randint(0, 100),))


def _larger(rng):
    name = rng.choice(["larger", "bigger", "max_of_two"])
    return name, "a: int, b: int", "Return the larger of a and b.", "return max(a, b)", max, lambda r: _ints(r, 2)


def _smaller(rng):
    name = rng.choice(["smaller", "min_of_two"])
    return name, "a: int, b: int", "Return the smaller of a and b.", "return min(a, b)", min, lambda r: _ints(r, 2)


def _reverse(rng):
    name = rng.choice(["reverse", "reversed_text", "backwards"])
    return name, "s: str", "Return s reversed.", "return s[::-1]", lambda s: s[::-1], _word


def _first_chars(rng):
    k = rng.randint(2, 4)
    return (f"first_{k}", "s: str", f"Return the first {k} characters of s.", f"return s[:{k}]",
            lambda s: s[:k], _word)


def _repeat(rng):
    k = rng.randint(2, 4)
    return (f"repeat_{k}", "s: str", f"Return s repeated {k} times.", f"return s * {k}", lambda s: s * k, _word)


def _upper(rng):
    name = rng.choice(["shout", "to_upper", "upper_case"])
    return name, "s: str", "Return s in upper case.", "return s.upper()", lambda s: s.upper(), _word


def _last(rng):
    name = rng.choice(["last", "last_item", "final_element"])
    return name, "xs: list", "Return the last element of xs.", "return xs[-1]", lambda xs: xs[-1], _int_list


def _total(rng):
    name = rng.choice(["total", "sum_all", "list_sum"])
    return name, "xs: list", "Return the sum of the numbers in xs.", "return sum(xs)", sum, _int_list


def _count(rng):
    v = rng.randint(0, 9)
    return (f"count_{v}s", "xs: list", f"Return how many times {v} appears in xs.", f"return xs.count({v})",
            lambda xs: xs.count(v), lambda r: ([r.randint(0, 9) for _ in range(r.randint(1, 8))],))


def _above(rng):
    k = rng.randint(0, 20)
    return (f"above_{k}", "xs: list", f"Return the elements of xs greater than {k}, in order.",
            f"return [x for x in xs if x > {k}]", lambda xs: [x for x in xs if x > k], _int_list)


def _add_each(rng):
    k = rng.randint(1, 20)
    return (f"add_{k}_to_each", "xs: list", f"Return a list with {k} added to each element of xs.",
            f"return [x + {k} for x in xs]", lambda xs: [x + k for x in xs], _int_list)


def _power(rng):
    k = rng.randint(2, 4)
    return (f"power_{_NUMBERS[k]}", "x: int", f"Return x to the power of {k}.", f"return x ** {k}",
            lambda x: x ** k, lambda r: _ints(r, 1, -9, 12))


def _affine(rng):
    a, b = rng.randint(2, 9), rng.randint(1, 30)
    return (f"times_{a}_plus_{b}", "x: int", f"Return x multiplied by {a}, plus {b}.", f"return x * {a} + {b}",
            lambda x: x * a + b, _ints)


def _last_chars(rng):
    k = rng.randint(2, 4)
    return (f"last_{k}", "s: str", f"Return the last {k} characters of s.", f"return s[-{k}:]",
            lambda s: s[-k:], _word)


def _without(rng):
    c = rng.choice("aeinorst")
    return (f"drop_{c}", "s: str", f"Return s with every '{c}' removed.", f"return s.replace({c!r}, '')",
            lambda s: s.replace(c, ""), _word)


def _between(rng):
    low = rng.randint(0, 15)
    high = low + rng.randint(3, 12)
    return (f"count_{low}_to_{high}", "xs: list",
            f"Return how many elements of xs are from {low} to {high}, inclusive.",
            f"return sum({low} <= x <= {high} for x in xs)", lambda xs: sum(low <= x <= high for x in xs), _int_list)


def _vowels(rng):
    name = rng.choice(["vowels", "count_vowels", "vowel_count"])
    return (name, "s: str", "Return the number of vowels (a, e, i, o, u) in s.",
            "return sum(c in 'aeiou' for c in s)", lambda s: sum(c in "aeiou" for c in s), _word)


def _even_sum(rng):
    name = rng.choice(["even_sum", "sum_of_evens", "total_even"])
    return (name, "xs: list", "Return the sum of the even numbers in xs.", "return sum(x for x in xs if x % 2 == 0)",
            lambda xs: sum(x for x in xs if x % 2 == 0), _int_list)


def _digit_sum(rng):
    name = rng.choice(["digit_sum", "sum_of_digits", "add_digits"])
    return (name, "n: int", "Return the sum of the decimal digits of n (n >= 0).",
            "return sum(int(d) for d in str(n))", lambda n: sum(int(d) for d in str(n)),
            lambda r: (r.randint(0, 99999),))


def _argmax(rng):
    name = rng.choice(["index_of_max", "argmax", "where_largest"])
    return (name, "xs: list", "Return the index of the largest element of xs (the first, if it appears twice).",
            "return xs.index(max(xs))", lambda xs: xs.index(max(xs)), _int_list)


FAMILIES = {f.name: f for f in (
    Family("add", _add), Family("times", _times), Family("minus", _minus), Family("divisible", _divisible),
    Family("larger", _larger), Family("smaller", _smaller), Family("reverse", _reverse),
    Family("first_chars", _first_chars), Family("repeat", _repeat), Family("upper", _upper), Family("last", _last),
    Family("total", _total), Family("count", _count), Family("above", _above), Family("add_each", _add_each),
    Family("power", _power), Family("affine", _affine), Family("last_chars", _last_chars),
    Family("without", _without), Family("between", _between), Family("vowels", _vowels),
    Family("even_sum", _even_sum), Family("digit_sum", _digit_sum), Family("argmax", _argmax),
)}


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(map(repr, args))})"


def _telling(fn: Callable, cases: list[tuple]) -> bool:
    """Whether ``cases`` tell the function from the shortcuts: a constant (their expected values are
    not all equal) and its first argument returned as it is (one of them differs from it)."""
    outputs = [repr(fn(*args)) for args in cases]
    return len(set(outputs)) > 1 and any(out != repr(args[0]) for out, args in zip(outputs, cases))


def _task(family: Family, rng: random.Random) -> dict[str, Any]:
    """One task entry: question (the function to complete), answer (the whole function, fenced), metadata."""
    name, signature, doc, body, fn, inputs = family.make(rng)
    example, cases = inputs(rng), []
    while len(cases) < CASES or not _telling(fn, cases):  # distinct cases, the example's arguments first
        if len(cases) == CASES:
            cases.pop()
        args = inputs(rng) if cases else example
        if args not in cases:
            cases.append(args)
    prompt = (f"def {name}({signature}):\n    \"\"\"{doc}\n    >>> {_call(name, example)}\n"
              f"    {fn(*example)!r}\n    \"\"\"\n")
    asserts = "\n".join(f"    assert candidate({', '.join(map(repr, args))}) == {fn(*args)!r}" for args in cases)
    return {"question": prompt, "answer": f"```python\ndef {name}({signature}):\n    {body}\n```",
            "metadata": {"code_prompt": prompt, "entry_point": name, "family": family.name, "domain": "code",
                         "tests": f"def check(candidate):\n{asserts}\n\n\ncheck({name})\n"}}


def python_function_entries(params: dict[str, Any], size: int, seed: int) -> list[dict[str, Any]]:
    """``size`` task entries (question, answer, metadata), families in turn from ``params.families``
    (default: all), parameters drawn with ``seed``."""
    names = params.get("families") or list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"params.families: unknown {', '.join(map(repr, unknown))}; known: {', '.join(FAMILIES)}")
    rng = random.Random(seed)
    return [_task(FAMILIES[names[i % len(names)]], rng) for i in range(size)]


def more_cases(answer: str, metadata: dict[str, Any], n: int = MORE_CASES, seed: int = 0) -> str:
    """HumanEval-form tests of ``n`` more cases for a task of this module: arguments drawn by its
    family's input maker, expected values computed by its gold ``answer`` (this module's reference
    body, not a model's, so it runs here). A task's own four cases can pass a wrong answer (an
    off-by-one at a bound none of them touches); an answer that passes these too is right on them."""
    name = metadata["entry_point"]
    *_, inputs = FAMILIES[metadata["family"]].make(random.Random(seed))
    namespace: dict[str, Any] = {}
    exec(answer.split("```python\n", 1)[1].rsplit("```", 1)[0], namespace)  # noqa: S102 (the reference)
    rng = random.Random(seed)
    cases = [inputs(rng) for _ in range(n)]
    asserts = "\n".join(f"    assert candidate({', '.join(map(repr, args))}) == {namespace[name](*args)!r}"
                        for args in cases)
    return f"def check(candidate):\n{asserts}\n\n\ncheck({name})\n"

"""The demo's tasks: tiny Python projects, each with one bug, visible tests and hidden tests.

Each task is a module with a bug, the right patch, and a plausible wrong patch; the scripted agent
applies one or the other, so a run shows both solved and unsolved tasks. :func:`task_lines` writes them
as a rollouts task file, each with a difficulty (the scripted policy's chance of the right patch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROJECT = "/workspace/project"
DIFFICULTY = {"easy": 1.0, "medium": 0.6, "hard": 0.3, "impossible": 0.0}


@dataclass(frozen=True)
class Task:
    """One bug-fixing task."""

    task_id: str
    module: str
    """File name of the module under test."""
    source: str
    """The buggy module."""
    bug: str
    """The buggy line, as it appears in ``source``."""
    right_fix: str
    wrong_fix: str
    visible_test: str
    hidden_test: str


_TEMPLATES = [
    (
        "mathops.py",
        "def add(a, b):\n    return a - b\n\n\ndef scale(xs, k):\n    return [x * k for x in xs]\n",
        "    return a - b",
        "    return a + b",
        "    return abs(a - b)",
        "from mathops import add\nassert add(2, 2) == 4, add(2, 2)\n",
        "from mathops import add, scale\nassert add(-3, 5) == 2\nassert add(0, 0) == 0\n"
        "assert scale([1, 2], 3) == [3, 6]\n",
    ),
    (
        "seq.py",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, a + b\n    return a\n",
        "    for _ in range(n - 1):",
        "    for _ in range(n):",
        "    for _ in range(n + 1):",
        "from seq import fib\nassert fib(1) == 1, fib(1)\n",
        "from seq import fib\nassert [fib(i) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]\n",
    ),
    (
        "text.py",
        "def title_words(s):\n    return ' '.join(w.capitalize() for w in s.split(' ')[1:])\n",
        "    return ' '.join(w.capitalize() for w in s.split(' ')[1:])",
        "    return ' '.join(w.capitalize() for w in s.split(' '))",
        "    return s.title()",
        "from text import title_words\nassert title_words('hello world') == 'Hello World'\n",
        "from text import title_words\nassert title_words(\"it's a test\") == \"It's A Test\"\n"
        "assert title_words('x') == 'X'\n",
    ),
    (
        "stats.py",
        "def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n",
        "    return sum(xs) / (len(xs) + 1)",
        "    return sum(xs) / len(xs)",
        "    return sum(xs) // len(xs)",
        "from stats import mean\nassert mean([2, 4]) == 3, mean([2, 4])\n",
        "from stats import mean\nassert mean([1, 2]) == 1.5\nassert mean([5]) == 5\n",
    ),
    (
        "sorting.py",
        "def top_k(xs, k):\n    return sorted(xs)[:k]\n",
        "    return sorted(xs)[:k]",
        "    return sorted(xs, reverse=True)[:k]",
        "    return sorted(xs)[-k:]",
        "from sorting import top_k\nassert top_k([1, 5, 3], 1) == [5], top_k([1, 5, 3], 1)\n",
        "from sorting import top_k\nassert top_k([4, 1, 9, 7], 2) == [9, 7]\nassert top_k([], 3) == []\n",
    ),
]


def make_tasks(count: int) -> list[Task]:
    """``count`` tasks cycling through the templates."""
    tasks = []
    for i in range(count):
        module, source, bug, right, wrong, visible, hidden = _TEMPLATES[i % len(_TEMPLATES)]
        tasks.append(Task(f"demo-{i:03d}-{module[:-3]}", module, source, bug, right, wrong, visible, hidden))
    return tasks


def task_line(task: Task, difficulty: str, *, think_s: float = 0.0) -> dict[str, Any]:
    """One task as a rollouts task-file line: the project as inline files, hidden tests as the check, and
    the scripted policy (right patch with the difficulty's probability)."""
    return {
        "id": task.task_id,
        "workdir": PROJECT,
        "files": {task.module: task.source, "test_visible.py": task.visible_test},
        "prompt": f"The test in test_visible.py fails. Fix the bug in {task.module}.",
        # Hidden tests arrive only at grading; the agent never sees them.
        "check": {"test": "PYTHONPATH=. python3 /grader/test_hidden.py", "timeout_s": 60,
                  "files": {"/grader/test_hidden.py": task.hidden_test}},
        "timeout_s": 120,
        "resources": {"cpu": 0.5, "memory_mb": 256},
        # No .pyc: a same-size patch within the same second would leave a stale one valid (and the fix unseen).
        "env": {"PYTHONDONTWRITEBYTECODE": "1"},
        "labels": {"difficulty": difficulty},
        "scripted": {"p_solve": DIFFICULTY[difficulty], "think_s": think_s,
                     "inspect": ["ls -la && python3 --version", f"cat {task.module}", "python3 test_visible.py"],
                     "edit": {"path": task.module, "find": task.bug, "right": task.right_fix, "wrong": task.wrong_fix},
                     "verify": ["python3 test_visible.py"]},
    }


def task_lines(count: int, difficulties: tuple[str, ...] = ("easy", "medium", "medium", "hard", "impossible"),
               *, think_s: float = 0.0) -> list[dict[str, Any]]:
    """``count`` tasks, difficulties cycling through ``difficulties``."""
    return [task_line(t, difficulties[i % len(difficulties)], think_s=think_s)
            for i, t in enumerate(make_tasks(count))]

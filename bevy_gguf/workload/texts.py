"""The text workload: varied texts that every machine has or that a small grammar makes.

Kinds (docs/models.md): prose (docstrings of the Python standard library), code (function
sources of the standard library), numbers and several languages (small grammars of our own).
Nothing here is a copied text: the standard library is read at run time, the grammars only hold
words. A request's prompt is the start of its text; decode steps feed the text's next tokens
(teacher forcing), so a step costs what a generated token costs.
"""

from __future__ import annotations

import ast
import importlib.util
import random
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

KINDS = ("prose", "code", "numbers", "multilingual")
MIN_CHARS = 400

# standard-library modules present in every CPython 3.9+ (missing ones are skipped)
STDLIB_MODULES = (
    "argparse", "ast", "bisect", "calendar", "colorsys", "csv", "dataclasses", "datetime",
    "difflib", "fractions", "functools", "heapq", "inspect", "ipaddress", "json.decoder",
    "json.encoder", "pathlib", "pprint", "random", "shlex", "statistics", "string",
    "textwrap", "tokenize", "uuid", "zipfile", "gettext", "imaplib", "mailbox", "smtplib",
    "tarfile", "configparser", "locale", "optparse", "pickle", "queue", "sched", "selectors",
    "shutil", "socketserver", "subprocess", "tempfile", "threading", "trace", "wave",
)


@dataclass(frozen=True, slots=True)
class Text:
    kind: str
    source: str  # where it came from: a module and line, or a grammar and seed
    text: str


@cache
def _stdlib_pieces() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(prose, code): docstrings and function sources of the standard library, in a fixed order."""
    prose: list[tuple[str, str]] = []
    code: list[tuple[str, str]] = []
    for name in STDLIB_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        source = Path(spec.origin).read_text(encoding="utf-8", errors="replace")
        lines = source.splitlines()
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= MIN_CHARS:
                    line = getattr(node, "lineno", 1)
                    prose.append((f"{name}:{line} docstring", re.sub(r"\s+", " ", doc).strip()))
            if isinstance(node, ast.FunctionDef) and node.end_lineno:
                seg = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                if len(seg) >= MIN_CHARS:
                    code.append((f"{name}:{node.lineno} {node.name}()", seg))
    return prose, code


_NUMBER_TEMPLATES = (
    lambda r: f"Invoice {r.randint(1000, 9999)}: {r.randint(2, 40)} items at {r.uniform(1, 90):.2f} each, "
    f"paid on {r.randint(1990, 2030)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}. ",
    lambda r: f"| {r.randint(0, 999):>3} | {r.uniform(-50, 50):8.3f} | {r.randint(0, 99999):>6} |\n",
    lambda r: f"x{r.randint(0, 9)} = {r.uniform(0, 10):.4f} * {r.randint(2, 99)} + {r.randint(-500, 500)}; ",
    lambda r: "sequence: " + ", ".join(str(r.randint(0, 10 ** r.randint(1, 6))) for _ in range(8)) + ". ",
    lambda r: f"{r.randint(1, 31)}/{r.randint(1, 12)} {r.randint(0, 23):02d}:{r.randint(0, 59):02d} "
    f"temp {r.uniform(-20, 40):.1f}C, pressure {r.randint(960, 1050)} hPa. ",
)

# each language: (subjects, verbs, objects, endings); words only, sentences are generated
_LANGUAGES: dict[str, tuple[tuple[str, ...], ...]] = {
    "de": (("Der alte Müller", "Die kleine Katze", "Ein fröhlicher Schüler", "Unsere Nachbarin"),
           ("liest", "findet", "repariert", "bemerkt", "trägt"),
           ("ein großes Buch", "die grüne Brücke", "den schweren Koffer", "zwölf Äpfel"),
           ("am Morgen.", "im Winter.", "hinter dem Bahnhof.", "ohne Grund.")),
    "fr": (("Le vieux boulanger", "Une élève curieuse", "Mon frère aîné", "La voisine"),
           ("regarde", "répare", "achète", "découvre", "dessine"),
           ("un château étrange", "la fenêtre cassée", "des pêches mûres", "un vélo rouge"),
           ("à midi.", "près de la rivière.", "en été.", "sans hésiter.")),
    "es": (("El pescador", "Una niña alegre", "Mi abuela", "El señor Núñez"),
           ("encuentra", "pinta", "compra", "lleva", "olvida"),
           ("una canción antigua", "el puente viejo", "tres limones", "la llave dorada"),
           ("por la mañana.", "en el jardín.", "después de la lluvia.", "cada domingo.")),
    "ru": (("Старый рыбак", "Маленькая девочка", "Наш учитель", "Соседка"),
           ("читает", "находит", "рисует", "покупает", "несёт"),
           ("большую книгу", "зелёный мост", "тяжёлый чемодан", "двенадцать яблок"),
           ("утром.", "зимой.", "за вокзалом.", "без причины.")),
    "el": (("Ο γέρος ψαράς", "Η μικρή γάτα", "Ο δάσκαλος", "Η γειτόνισσα"),
           ("διαβάζει", "βρίσκει", "ζωγραφίζει", "αγοράζει"),
           ("ένα μεγάλο βιβλίο", "την πράσινη γέφυρα", "δώδεκα μήλα", "ένα κόκκινο ποδήλατο"),
           ("το πρωί.", "τον χειμώνα.", "στον κήπο.", "χωρίς λόγο.")),
    "zh": (("老渔夫", "小女孩", "我们的老师", "邻居"),
           ("读了", "找到了", "画了", "买了", "带来了"),
           ("一本大书", "绿色的桥", "沉重的箱子", "十二个苹果"),
           ("在早上。", "在冬天。", "在车站后面。", "没有原因。")),
    "ja": (("年老いた漁師が", "小さな猫が", "先生が", "隣の人が"),
           ("静かに", "急いで", "楽しく", "ゆっくり"),
           ("大きな本を読む", "緑の橋を渡る", "重い鞄を運ぶ", "りんごを買う"),
           ("朝に。", "冬に。", "駅の裏で。", "理由もなく。")),
}


def _numbers_text(seed: int) -> Text:
    r = random.Random(f"numbers-{seed}")
    parts: list[str] = []
    while len("".join(parts).encode()) < MIN_CHARS:
        parts.append(r.choice(_NUMBER_TEMPLATES)(r))
    return Text("numbers", f"numbers grammar, seed {seed}", "".join(parts))


def _multilingual_text(seed: int) -> Text:
    r = random.Random(f"multilingual-{seed}")
    lang = sorted(_LANGUAGES)[seed % len(_LANGUAGES)]
    subjects, verbs, objects, endings = _LANGUAGES[lang]
    sep = "" if lang in ("zh", "ja") else " "
    parts: list[str] = []
    while len(sep.join(parts).encode()) < MIN_CHARS:
        parts.append(sep.join((r.choice(subjects), r.choice(verbs), r.choice(objects), r.choice(endings))))
    return Text("multilingual", f"{lang} grammar, seed {seed}", sep.join(parts))


def texts(n: int, seed: int = 0) -> list[Text]:
    """n different texts, kinds interleaved (prose, code, numbers, multilingual, ...)."""
    prose, code = _stdlib_pieces()
    if not prose or not code:
        raise RuntimeError("no standard-library sources found: the text workload needs a CPython with its .py files")
    r = random.Random(f"texts-{seed}")
    prose_order = r.sample(range(len(prose)), len(prose))
    code_order = r.sample(range(len(code)), len(code))
    out: list[Text] = []
    for i in range(n):
        kind, nth = KINDS[i % len(KINDS)], i // len(KINDS)
        if kind == "prose":
            src, text = prose[prose_order[nth % len(prose)]]
            out.append(Text(kind, src, text))
        elif kind == "code":
            src, text = code[code_order[nth % len(code)]]
            out.append(Text(kind, src, text))
        elif kind == "numbers":
            out.append(_numbers_text(seed * 1000 + nth))
        else:
            out.append(_multilingual_text(seed * 1000 + nth + i))
    return out

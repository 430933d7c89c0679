"""Write tests/fixtures/tokenizer_corpus.json: varied texts for the tokenizer tests.

Run from the repository root (any python 3.11, no dependencies):

    python scripts/make_tokenizer_corpus.py

Handwritten texts (prose, code, JSON, CJK, emoji, whitespace and digit edge
cases, special-token strings written inside text) plus seeded combinations of
them, so the output is the same on every run. After changing it, regenerate
the llama.cpp reference with scripts/make_tokenizer_fixture.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tokenizer_corpus.json"

PROSE = [
    "Hello world",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "Offline batch inference trades latency for throughput: many prompts share one forward pass.",
    'She said, "I don\'t know what you mean," and walked away.',
    "Mr. O'Neil's dog isn't here; it's at Mrs. D'Angelo's house.",
    "it's I'LL we've they're you'd she'd HE'S I'm WE'VE THEY'RE YOU'D I'M",
    "Don't, won't, can't, shouldn't've, y'all'd've",
    "rock 'n' roll, 'tis the season, 'twas the night",
    "A sentence ending in an ellipsis...",
    "Question? Exclamation! Interrobang?! Semicolon; colon: dash - em dash \u2014 en dash \u2013.",
    "UPPERCASE lowercase MiXeDcAsE camelCase snake_case kebab-case PascalCase",
    "e.g. i.e. etc. vs. a.m. p.m. U.S.A.",
    "The year 2024 had 366 days; 1,234,567.89 dollars were spent.",
    "Call 555-0123 or +1 (800) 555-0199 before 5:30pm.",
    "Temperature: -40\u00b0C = -40\u00b0F. Pi \u2248 3.14159265358979.",
    "1/2 + 3/4 = 5/4, 10% of 250 is 25, 2^10 = 1024",
    "He scored 99.5% on test #3 (out of 100).",
    "Version 3.11.4 and v2.0.0-rc.1+build.5",
    "a",
    "I",
    " ",
    "  ",
    ".",
    "!",
    "?",
    "'",
    "'s",
    "''",
    '""',
    "x y z",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore.",
]

CODE = [
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "import numpy as np\n\nx = np.zeros((3, 4), dtype=np.float32)\nprint(x.shape)\n",
    'class Foo(Bar):\n    """Docstring."""\n\n    def __init__(self, *args, **kwargs):\n        super().__init__(*args, **kwargs)\n',
    'if x >= 10 and y != 3:\n\tprint(f"{x=} {y!r}")\nelif not z:\n\tpass\n',
    "lambda x: x ** 2 // 3 % 7 @ m",
    "result = [i * i for i in range(10) if i % 2 == 0]",
    "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise ValueError('bad') from e",
    "function add(a, b) {\n  return a + b;\n}\nconsole.log(add(1, 2));",
    "const xs = [1, 2, 3].map((x) => x * 2).filter(Boolean);",
    "let obj = { key: 'value', nested: { arr: [1, 2, 3] } };",
    "async function main() { await fetch('https://example.com/api?x=1&y=2'); }",
    "x === y ? a : b; x !== null && x?.y ?? z;",
    '#include <stdio.h>\n\nint main(void) {\n    printf("Hello, %s!\\n", "world");\n    return 0;\n}\n',
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }",
    "struct node { struct node *next; void *data; };",
    '#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  echo "$f"\ndone\n',
    "ls -la | grep -v '^d' | awk '{print $9}' > files.txt 2>&1",
    'export PATH="$HOME/.local/bin:$PATH" && cd ~/src && make -j$(nproc)',
    "curl -sSL https://example.org/install.sh | sh -s -- --yes",
    "SELECT id, name FROM users WHERE age > 21 ORDER BY name DESC LIMIT 10;",
    "<div class=\"container\"><p id='x'>Text &amp; more</p></div>",
    "body { margin: 0; padding: 0 1em; color: #ff00ff; }",
    'fn main() { let v: Vec<i32> = vec![1, 2, 3]; println!("{:?}", v); }',
    "    indented with four spaces",
    "\tindented with a tab",
    "\t\t\tthree tabs\tand\ttabs\t",
    "        eight spaces then code()",
    "x=1;y=2;z=x+y",
    "a==b!=c<=d>=e<<f>>g&&h||i",
    "/* block comment */ // line comment # hash comment",
    "__init__ __name__ == '__main__'",
    "@decorator\ndef f(): ...",
    "0x1F 0b1010 0o777 1e-10 3.14f 1_000_000",
]

JSON_TEXTS = [
    '{"id": "q1", "prompt": "What is 2+2?", "max_tokens": 32}',
    '{"custom_id": "r-7", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}',
    '[1, 2.5, -3e10, true, false, null, "s"]',
    '{\n  "nested": {\n    "list": [\n      {"a": 1},\n      {"b": [2, 3]}\n    ]\n  }\n}',
    '{"unicode": "\\u00e9\\u4e2d", "escaped": "line\\nbreak\\ttab"}',
    '{"emoji": "\\ud83d\\ude00", "raw": "\U0001f600", "cjk": "\u4e2d\u6587"}',
    '{"empty": {}, "arr": [], "str": ""}',
]

CJK = [
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8\u3002",
    "\u673a\u5668\u5b66\u4e60\u662f\u4eba\u5de5\u667a\u80fd\u7684\u4e00\u4e2a\u5206\u652f\u3002",
    "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002",
    "\u300a\u7ea2\u697c\u68a6\u300b\u662f\u4e2d\u56fd\u53e4\u5178\u5c0f\u8bf4\u3002",
    "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c",
    "\u79c1\u306f\u65e5\u672c\u8a9e\u3092\u52c9\u5f37\u3057\u3066\u3044\u307e\u3059\u3002",
    "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3068\u6f22\u5b57",
    "\u6771\u4eac\u30bf\u30ef\u30fc\u306f333\u30e1\u30fc\u30c8\u30eb\u3067\u3059\u3002",
    "\uff8a\uff9d\uff76\uff78\uff76\uff80\uff76\uff85 \uff21\uff22\uff23 \uff11\uff12\uff13",
    "\uc548\ub155\ud558\uc138\uc694, \uc138\uacc4!",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc640 English mixed",
    "\u4e2d\u6587English\u6df7\u5408123\u6570\u5b57",
    "\u3000\u5168\u89d2\u30b9\u30da\u30fc\u30b9\u3000",
]

EMOJI = [
    "\U0001f600",
    "\U0001f917 hugging face",
    "I \u2764\ufe0f Python \U0001f40d",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f469\u200d\U0001f4bb coding",
    "\U0001f3f3\ufe0f\u200d\U0001f308",
    "\U0001f1fa\U0001f1f8\U0001f1ef\U0001f1f5\U0001f1eb\U0001f1f7",
    "\U0001f44d\U0001f3fd thumbs up, medium skin tone",
    "\U0001f44b\U0001f3fb\U0001f44b\U0001f3fc\U0001f44b\U0001f3fd\U0001f44b\U0001f3fe\U0001f44b\U0001f3ff",
    "\U0001f600\U0001f601\U0001f602\U0001f923\U0001f603",
    "\u2603\ufe0f \u2600 \u2601 \u2602",
    "#\ufe0f\u20e3 1\ufe0f\u20e3 *\ufe0f\u20e3",
    "\U0001f9d1\u200d\U0001f91d\u200d\U0001f9d1",
    "end with emoji \U0001f680",
    "\U0001f525\U0001f525\U0001f525",
]

ACCENTS = [
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade co\u00f6perate",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    "\u00c5ngstr\u00f6m \u00dcber Stra\u00dfe \u0141\u00f3d\u017a \u0160koda",
    "Espa\u00f1ol: \u00bfQu\u00e9 tal? \u00a1Muy bien!",
    "Portugu\u00eas: a\u00e7\u00e3o, cora\u00e7\u00e3o, n\u00e3o",
    "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u03ba\u03b5\u03af\u03bc\u03b5\u03bd\u03bf",
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442, \u043f\u0440\u0438\u0432\u0435\u0442!",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0645\u0646 \u0627\u0644\u064a\u0645\u064a\u0646",
    "\u05e2\u05d1\u05e8\u05d9\u05ea \u05e9\u05dc\u05d5\u05dd",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
    "\ufb01 \ufb02 \u2126 \u212b \u2160\u2161\u2162",
    "\u00bd \u00bc \u00b2 \u00b3 \u2460\u2461 \u0663\u0664\u0665",
]

WHITESPACE = [
    "",
    "\n",
    "\n\n",
    "\n\n\n",
    " \n",
    "\n ",
    " \n \n ",
    "trailing space ",
    "trailing spaces   ",
    "   leading spaces",
    "a  b   c    d     e",
    "line1\nline2\n\nline4\n\n\n\nline8",
    "tab\there\t\tand\t\t\tthere",
    "mixed \t \n\t\n  \n",
    "\r\n windows \r\nline\r\n",
    "word\n\n\n\nword",
    "    ",
    "\t",
    "\t\t",
    "end\n",
    "end \n",
    "end  \n\n",
    "a\u00a0b\u00a0\u00a0c",
    "a\u2003b\u2009c\u200ad",
    "a\u200bb\u200cc\u200dd\ufeffe",
    "line\u2028sep\u2029para",
    "next\u0085line",
    "\u000b\u000c vertical tab and form feed",
    "  \n\n  \t\t  ",
]

DIGITS = [
    "0",
    "7",
    "42",
    "123",
    "1234",
    "12345678901234567890",
    "3.141592653589793238462643383279",
    "-0.0001",
    "1,000,000",
    "2024-06-01T12:34:56Z",
    "127.0.0.1:8080",
    "IPv6 ::1 and fe80::1ff:fe23:4567:890a",
    " 12 345 6789",
    "a1b2c3d4",
    "x10000y",
    "\u0661\u0662\u0663 \u0967\u0968\u0969 \uff11\uff12\uff13",
    "007 James Bond",
    "99 bottles of beer",
    "0000000000",
    "1st 2nd 3rd 4th 21st",
]

PUNCT = [
    "!!!",
    "???!!!...",
    "...",
    "\u2026",
    "---",
    "===",
    "***bold***",
    "@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "(((nested)))",
    "<<>>",
    "\"quoted\" 'single' \u201ccurly\u201d \u2018curly\u2019 \u00abguillemets\u00bb",
    "a--b__c..d,,e;;f",
    "\\ backslash \\\\ double",
    "~/.config/miro/settings.toml",
    # bytes this vocabulary has no token for: llama.cpp drops them
    "ctrl \x04\x06 bytes \x13\x14\x16\x1d and plane-4 \U00040000 \U00080000 chars \x00\x01\x7f",
]

URLS = [
    "https://www.example.com/path/to/page?query=string&foo=bar#fragment",
    "http://localhost:6379/0",
    "redis://user:pass@host:6379/2",
    "Visit https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct for details.",
    "mailto:someone@example.com",
    "ftp://files.example.org/pub/file.tar.gz",
    "www.google.com",
    "user.name+tag@sub.domain.co.uk",
]

MARKDOWN = [
    "# Heading 1\n## Heading 2\n### Heading 3",
    "- item one\n- item two\n  - nested item\n* star item",
    "1. first\n2. second\n3. third",
    "**bold** and *italic* and `code` and ~~strike~~",
    "```python\nprint('hi')\n```",
    "> a quote\n> continues",
    "[link text](https://example.com) ![alt](img.png)",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "---\ntitle: front matter\n---\n",
    "Footnote[^1].\n\n[^1]: The note.",
]

SPECIAL_STRINGS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n",
    "text before <|endoftext|> text after",
    "<|im_start|><|im_end|><|endoftext|>",
    "<|im_start|><|im_start|>",
    "<|im_end|>\n\n<|im_end|>",
    " <|im_start|> spaced <|im_end|> ",
    "<|im_start",
    "im_start|>",
    "<|im_start|x>",
    "<||im_start||>",
    "<|IM_START|>",
    "<|im_start|>\U0001f600<|im_end|>",
    "<repo_name>miro<file_sep>core/tokenizers/tokenizer.py",
    "<filename>a.py\n<gh_stars>10",
    "<jupyter_start><jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "<issue_start>bug<issue_comment>fixed<issue_closed>",
    "<s> </s> <unk> <pad> [CLS] [SEP] <|eot_id|>",
    "the token <|im_end|> ends a turn",
    "<|endoftext|><|endoftext|>",
    "x<|im_end|>y",
]

JOINERS = [" ", "\n", "\n\n", "", "\t", "  ", " \n", ", "]


def combinations(pool: list[str], n: int, rng: random.Random) -> list[str]:
    out = []
    for _ in range(n):
        k = rng.randint(2, 4)
        parts = [rng.choice(pool) for _ in range(k)]
        text = parts[0]
        for part in parts[1:]:
            text += rng.choice(JOINERS) + part
        out.append(text)
    return out


def edge_strings(rng: random.Random) -> list[str]:
    """Runs and random mixes of characters around the pre-tokenizer's boundaries."""
    chars = " \t\n\r'sSlLtT0123456789aZ\u00e9\u4e2d\u3042\U0001f600.,!?-_/\\\"\u00a0\u3000\u200d"
    out = [" " * n for n in (3, 5, 8, 16)] + ["\n" * n for n in (4, 7)]
    out += ["9" * n for n in (11, 33)] + ["ab" * 20, "'" * 6, "!?" * 10]
    for _ in range(40):
        out.append("".join(rng.choice(chars) for _ in range(rng.randint(3, 24))))
    return out


def build() -> list[str]:
    rng = random.Random(1234)
    handwritten = (
        PROSE
        + CODE
        + JSON_TEXTS
        + CJK
        + EMOJI
        + ACCENTS
        + WHITESPACE
        + DIGITS
        + PUNCT
        + URLS
        + MARKDOWN
        + SPECIAL_STRINGS
    )
    texts = handwritten + edge_strings(rng) + combinations(handwritten, 80, rng)
    seen: set[str] = set()
    return [t for t in texts if not (t in seen or seen.add(t))]


def main() -> None:
    texts = build()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(texts, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(texts)} texts to {OUT}")


if __name__ == "__main__":
    main()

"""The probe corpus: texts where a tiktoken mirror of a tokenizer would most likely give
other ids than the tokenizer itself. `FastTokenizer` encodes them both ways before it
trusts the mirror; the tests fuzz beyond them."""

from __future__ import annotations

import random
from collections.abc import Iterable


def probe_corpus(specials: Iterable[str] = ()) -> list[str]:
    """Texts where a mirror would most likely differ from HF; deterministic."""
    specials = list(specials)
    texts = [
        "",
        "Hello, world! How's it going? I'M FINE, THEY'LL SEE; we'Re ok, don't WON'T it'd",
        "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D ’s ’t",
        "你好，世界！这是一个测试。中文标点：“引号”、《书名》",
        "こんにちは、世界。カタカナとひらがな、漢字。ｶﾀｶﾅ",
        "안녕하세요 세계, 한국어 텍스트 \u1100\u1161\u11a8 \u1112\u1161\u11ab",
        "مرحبا بالعالم، هذا اختبار. ١٢٣٤٥ שלום עולם",
        "नमस्ते दुनिया। สวัสดีชาวโลก ጤና ይስጥልኝ ᏣᎳᎩ",
        "Привет, мир! Γειά σου Κόσμε! Tiếng Việt có dấu, Ελληνικά",
        "emoji 👋🌍 👨‍👩‍👧‍👦 🇫🇷🇯🇵 👍🏽 ❤️ ☕️ 🏳️‍🌈 😀😃😄",
        "math ∑∫√∞ ≠ ≤ ≥ ± × ÷ ∂ ∇ ∀x∈ℝ: x² ≥ 0 ½ ⅷ ① ² ₃",
        "e\u0301 a\u0308 n\u0303 o\u0302\u0323 \u212b \u212a \u2126 \ufb01 ＡＢＣ１２３ \u00c5 A\u030a",
        "zero\u200bwidth\u200d join\ufeffbom \u202eRTL\u202c \u00a0nbsp\u3000ideo\u2028ls\u2029ps\u0085nel",
        "ctrl \x00\x01\x07\x1b[0m\x7f tab\tvt\x0bff\x0cend",
        "def f(x: int) -> int:\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C", "n": [1, 2.5, -3e10]}}',
        '<div class="a">&nbsp;<br/></div> <script>if (a<b && c>d) { x = y || z; }</script>',
        'fn main() { let v: Vec<Option<&\'static str>> = vec![]; println!("{:?}", v); }',
        "SELECT * FROM t WHERE a >= 10 AND b <> 'x'; -- comment\r\nUPDATE t SET c=NULL;\r\n",
        "ls -la | grep '^d' && echo $HOME > /dev/null 2>&1\r\n\r\n",
        "1234567890 3.14159 1,000,000 0x1F 1e-9 2024-01-01T12:00:00Z 007 +44 (0)20 7946 0958",
        "AbCdEf GHI jKL MnO pQRSTUV wxyz ÀÉÎÕÜ àéîõü ß ẞ ǅ İı",
        " leading",
        "trailing ",
        "  two  spaces  ",
        " ",
        "\n",
        "\r\n",
        "\t",
        "\u00a0",
        "a\r\nb\rc\n\nd \n e \n\n f\t\n\tg",
        "   \n   \n\n   x",
        "x   \n",
        "x \n\n\n\n y",
        "\n\n\n",
        " \t \t ",
        "x\u3000\u3000y",
    ]
    texts += [f"a{ws * n}b" for ws in (" ", "\n", "\t", "\r\n", " \n") for n in (1, 2, 3, 4, 7, 8, 16, 33)]
    for s in specials:
        texts += [s, f"x{s}y", f" {s} ", f"{s}{s}", f"<{s}>", f"{s}\u0338", f"{s}\u0301e", f"e\u0301{s}", f"\n{s}\n"]
        texts += [s[:-1], s[1:], s[: len(s) // 2]]
    if specials:
        texts += ["".join(specials), " ".join(specials)]
    texts.append(
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi 👋 <tool_call>\n{}\n</tool_call>"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    texts += [
        "a" * 5000,
        " " * 3000 + "x",
        "\n" * 2000,
        "ab" * 3000,
        "😀" * 1000,
        "你" * 3000,
        "1" * 3000,
        "-" * 4000,
        "é" * 2000,
        "e\u0301" * 1000,
        "=" * 1000 + "\n",
        "\t" * 500 + "y",
    ]
    rng = random.Random(0x5EED)
    pools = [
        [chr(c) for c in range(0x20, 0x7F)] + [" ", " ", "\n", "\t", "'"],
        [chr(c) for c in range(0xA0, 0x250)],
        [chr(c) for c in range(0x300, 0x370)] + ["a", "e", "o", " "],
        [chr(c) for c in range(0x4E00, 0x4E80)] + ["，", "。", " "],
        [chr(c) for c in range(0xAC00, 0xAC40)] + [chr(c) for c in range(0x1100, 0x1180)],
        [chr(c) for c in range(0x1F300, 0x1F680)] + ["\u200d", "\ufe0f", " "],
        [chr(c) for c in range(0x2000, 0x2070)],
        ["<|", "|>", "<", ">", "|", "\n", " ", *specials],
    ]
    for _ in range(400):
        n = rng.randint(1, 48)
        if rng.random() < 0.25:  # any code point but surrogates
            chars = [chr(rng.choice((rng.randint(0, 0xD7FF), rng.randint(0xE000, 0x10FFFF)))) for _ in range(n)]
        else:
            chosen = rng.sample(pools, rng.randint(1, 3))
            chars = [rng.choice(rng.choice(chosen)) for _ in range(n)]
        texts.append("".join(chars))
    return texts

#!/usr/bin/env python3
"""Generate the tokenizer exactness fixtures in tests/text/data/ (run once; the
outputs are committed and the C++ tests read them without Python).

  corpus.bin          documents: magic "DSV4CORP", u32 count, then per doc
                      u32 byte length + the raw bytes (some are not UTF-8)
  corpus_ids.bin      expected ids: magic "DSV4IDS1", u32 count, then per doc
                      a LEB128 varint count followed by LEB128 varint ids
  decode_cases.bin    magic "DSV4DEC1", u32 count, then per case: varint n,
                      n varint ids, u32 length + expected decode (UTF-8)

The corpus is built deterministically (seeded) from text that ships with
Python itself (standard library sources: English prose and code) plus
generated Chinese, Japanese, Korean, emoji/ZWJ, combining marks, whitespace
and digit runs, every added token in context, random code points, and byte
strings that are not valid UTF-8.

Expected ids come from HF `tokenizers` on assets/tokenizer/tokenizer.json.
HF takes a str, so a document that is not valid UTF-8 is given to it as
bytes.decode("utf-8", "replace") -- what any caller of HF must do -- and our
tokenizer must produce the same ids from the raw bytes.

Usage: python3 tools/text/gen_tokenizer_corpus.py
Needs: pip install tokenizers==0.23.3
"""
import json
import os
import random
import struct
import sysconfig

from tokenizers import Tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKENIZER = os.path.join(ROOT, "assets", "tokenizer", "tokenizer.json")
OUT = os.path.join(ROOT, "tests", "text", "data")

rng = random.Random(20260427)


# ---------------------------------------------------------------- sources
def stdlib_docs(budget):
    """Slices of standard library sources (English comments/docstrings + code)."""
    lib = sysconfig.get_paths()["stdlib"]
    names = sorted(n for n in os.listdir(lib) if n.endswith(".py"))
    docs, total = [], 0
    for n in names:
        if total >= budget:
            break
        with open(os.path.join(lib, n), "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        start = rng.randrange(0, max(1, len(text) - 4000))
        piece = text[start:start + rng.randrange(500, 4000)]
        docs.append(piece)
        total += len(piece.encode())
    return docs


ZH = ["深度求索发布了新的语言模型，支持百万级上下文。",
      "我们在本地运行推理引擎，速度和精度都很重要。",
      "今天天气很好，我们去公园散步吧！",
      "请把这段代码翻译成中文注释：函数返回两个数的和。",
      "机器学习、自然语言处理和计算机视觉是人工智能的重要分支。"]
JA = ["東京は日本の首都です。今日はいい天気ですね。",
      "カタカナとひらがなを混ぜた文章をテストします。",
      "ラーメンを食べに行きましょう！",
      "このモデルは長い文脈を扱うことができます。"]
KO = ["안녕하세요, 만나서 반갑습니다.",
      "한국어 문장을 토크나이저로 시험합니다.",
      "오늘은 날씨가 정말 좋네요!"]
CJK_PUNCT = "，。！？、；：「」『』（）《》…—·～"


def rand_chars(lo, hi, n):
    return "".join(chr(rng.randrange(lo, hi + 1)) for _ in range(n))


def cjk_docs(count):
    docs = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randrange(3, 30)):
            k = rng.random()
            if k < 0.3:
                parts.append(rng.choice(ZH + JA + KO))
            elif k < 0.5:
                parts.append(rand_chars(0x4E00, 0x9FA5, rng.randrange(1, 20)))
            elif k < 0.6:
                parts.append(rand_chars(0x9FA6, 0x9FFF, rng.randrange(1, 4)))  # outside the V4 CJK set
            elif k < 0.7:
                parts.append(rand_chars(0x3040, 0x30FF, rng.randrange(1, 15)))
            elif k < 0.8:
                parts.append(rand_chars(0xAC00, 0xD7A3, rng.randrange(1, 12)))
            elif k < 0.9:
                parts.append(rng.choice(CJK_PUNCT) * rng.randrange(1, 3))
            else:
                parts.append(rng.choice([" ", "", "\n", "123", "ABC", "x", "３４５", "　"]))
        docs.append("".join(parts))
    return docs


EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "1️⃣", "#️⃣",
         "❤️", "🧑🏿‍🤝‍🧑🏻", "🐈‍⬛", "🫠", "🤖", "☕", "✅", "⚠️", "🧪", "🚀", "©️", "™"]


def emoji_docs(count):
    docs = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randrange(2, 40)):
            k = rng.random()
            if k < 0.5:
                parts.append(rng.choice(EMOJI))
            elif k < 0.6:  # random ZWJ / variation selector / skin tone glue
                parts.append(rng.choice(["\u200d", "\ufe0f", "\U0001F3FB", "\u20e3", "\U000E0067"]))
            elif k < 0.8:
                parts.append(rand_chars(0x1F300, 0x1FAFF, rng.randrange(1, 5)))
            else:
                parts.append(rng.choice([" ", "hello", "你好", "!", "\n", "ok👍"]))
        docs.append("".join(parts))
    return docs


def combining_docs(count):
    bases = "aeiouAEIOUnxzçş" + "अकखगनमय" + "بتثجح" + "กขคง" + "אבגד" + "Ωαβγ"
    docs = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randrange(5, 60)):
            parts.append(rng.choice(bases))
            for _ in range(rng.choice([0, 0, 1, 1, 2, 5])):
                lo, hi = rng.choice([(0x300, 0x36F), (0x900, 0x903), (0x93E, 0x94D),
                                     (0x64B, 0x65F), (0xE31, 0xE3A), (0x591, 0x5C7),
                                     (0x1AB0, 0x1AFF), (0x20D0, 0x20F0), (0xFE20, 0xFE2F)])
                parts.append(chr(rng.randrange(lo, hi + 1)))
            if rng.random() < 0.2:
                parts.append(rng.choice([" ", "\u0301", " \u0301", "1\u0301", "-", ".\u0300x"]))
        docs.append("".join(parts))
    return docs


WS = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u2029", "\u200b",
      "\u0085", "\u000b", "\u000c", "\u2003", "\u202f", "\u1680", "\u180e"]


def whitespace_docs(count):
    words = ["def", "x", "=", "1", "hello", "世界", "(", ")", ":", "#", "'", "\"", "é", "--",
             "return", "🙂", ".", "a.b", "$x", "'s", "don't", "...", "->", "{", "}"]
    docs = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randrange(5, 80)):
            if rng.random() < 0.5:
                n = rng.choice([1, 1, 2, 3, 4, 8, 17, 64, 200])
                parts.append("".join(rng.choice(WS) for _ in range(n)) if rng.random() < 0.5
                             else rng.choice(WS) * n)
            else:
                parts.append(rng.choice(words))
        docs.append("".join(parts))
    docs.append(" " * 5000)
    docs.append("\n" * 3000)
    docs.append(" \n" * 1000 + "x")
    docs.append("\t" * 999 + "end")
    return docs


DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "０１２３４５６７８９", "²³¹¼½¾", "ⅠⅡⅢⅣⅫ", "①②③", "𝟘𝟙𝟚", "๑๒๓"]


def digit_docs(count):
    docs = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randrange(3, 40)):
            k = rng.random()
            if k < 0.5:
                alphabet = rng.choice(DIGITS)
                parts.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 50))))
            elif k < 0.6:
                parts.append(str(rng.getrandbits(rng.randrange(1, 400))))
            else:
                parts.append(rng.choice([" ", ".", ",", "-", "e", "x", "abc", "v1.2.3", "3.14159",
                                         "1,000,000", "0x1F", "12:30", "$100", "第3章", "2026年"]))
        docs.append("".join(parts))
    docs.append("9" * 10001)
    docs.append("1234567890" * 300)
    return docs


def added_token_docs(added):
    contents = [a["content"] for a in added]
    docs = []
    # Every added token alone, in a sentence, glued to words, and doubled.
    for c in contents:
        docs.append(c)
        docs.append("Hello " + c + " world")
        docs.append("x" + c + c + "y")
    # Random mixes, including near-misses (prefixes/suffixes of tokens).
    for _ in range(600):
        parts = []
        for _ in range(rng.randrange(2, 25)):
            k = rng.random()
            c = rng.choice(contents)
            if k < 0.4:
                parts.append(c)
            elif k < 0.55:
                parts.append(c[:rng.randrange(1, len(c))] if len(c) > 1 else c)
            elif k < 0.65:
                parts.append(c[rng.randrange(1, len(c)):] if len(c) > 1 else c)
            else:
                parts.append(rng.choice([" ", "\n", "<", "</", "｜", "tool_calls>", "invoke name=\"f\">",
                                         "text", "思考", "<|", "|>", "<｜", "｜>", "\n\n", ">"]))
        docs.append("".join(parts))
    return docs


def random_codepoint_docs(count):
    docs = []
    for _ in range(count):
        cps = []
        for _ in range(rng.randrange(1, 200)):
            plane = rng.random()
            if plane < 0.5:
                c = rng.randrange(0, 0x10000)
            elif plane < 0.6:
                c = rng.randrange(0, 0x80)
            else:
                c = rng.randrange(0x10000, 0x110000)
            if 0xD800 <= c <= 0xDFFF:
                c = 0xFFFD
            cps.append(chr(c))
        docs.append("".join(cps))
    # Every ASCII character alone and in pairs with a letter.
    for c in range(128):
        docs.append(chr(c))
        docs.append(chr(c) + "a")
        docs.append(" " + chr(c) + "b\n")
    return docs


def invalid_utf8_docs(count):
    bad = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80",
           b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5", b"\xff", b"\xfe", b"\xe2\x82",
           b"\xf0\x9f\x98", b"\xf0\x9f", b"\xc3", b"\xe4\xb8", b"\xf8\x88\x80\x80\x80"]
    good = ["hello", " world", "你好", "😀", "é", "\n", "123", "<｜User｜>", " ", "ab"]
    docs = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randrange(1, 20)):
            if rng.random() < 0.4:
                parts.append(rng.choice(bad))
            else:
                parts.append(rng.choice(good).encode())
        docs.append(b"".join(parts))
    for _ in range(count):
        docs.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
    docs.append("ends mid character \u00e9".encode()[:-1])
    docs.append("ends mid emoji 😀".encode()[:-2])
    return docs


def mixed_docs(pool, count):
    docs = []
    for _ in range(count):
        docs.append("".join(rng.choice(pool) for _ in range(rng.randrange(2, 6))))
    return docs


# ---------------------------------------------------------------- writers
def varint(n, out):
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def main():
    tok = Tokenizer.from_file(TOKENIZER)
    with open(TOKENIZER, encoding="utf-8") as f:
        added = json.load(f)["added_tokens"]

    text_docs = []
    text_docs += stdlib_docs(520_000)
    text_docs += cjk_docs(450)
    text_docs += emoji_docs(350)
    text_docs += combining_docs(350)
    text_docs += whitespace_docs(350)
    text_docs += digit_docs(350)
    text_docs += added_token_docs(added)
    text_docs += random_codepoint_docs(400)
    text_docs += mixed_docs(text_docs[-3000:], 150)
    text_docs.append("")
    docs = [d.encode("utf-8") for d in text_docs] + invalid_utf8_docs(300)

    corpus = bytearray(b"DSV4CORP")
    ids_out = bytearray(b"DSV4IDS1")
    corpus += struct.pack("<I", len(docs))
    ids_out += struct.pack("<I", len(docs))
    n_ids = 0
    for raw in docs:
        text = raw.decode("utf-8", "replace")
        ids = tok.encode(text).ids
        # Sanity: HF itself round-trips (after the lossy repair).
        assert tok.decode(ids, skip_special_tokens=False) == text, repr(text[:80])
        corpus += struct.pack("<I", len(raw)) + raw
        varint(len(ids), ids_out)
        for i in ids:
            varint(i, ids_out)
        n_ids += len(ids)

    # Decode cases: random id sequences, including pieces of multi-byte
    # characters, special/added tokens and ids past the vocabulary.
    vocab_n = tok.get_vocab_size(with_added_tokens=True)
    dec = bytearray(b"DSV4DEC1")
    cases = []
    for _ in range(3000):
        n = rng.randrange(1, 24)
        ids = []
        for _ in range(n):
            k = rng.random()
            if k < 0.6:
                ids.append(rng.randrange(0, 128000))
            elif k < 0.75:
                ids.append(rng.randrange(128000, vocab_n))
            elif k < 0.95:
                ids.append(rng.randrange(3, 300))  # single bytes: broken UTF-8
            else:
                ids.append(rng.choice([0, 1, 2, 128821, 128822, 128825, vocab_n + 5]))
        cases.append(ids)
    dec += struct.pack("<I", len(cases))
    for ids in cases:
        text = tok.decode(ids, skip_special_tokens=False)
        varint(len(ids), dec)
        for i in ids:
            varint(i, dec)
        b = text.encode("utf-8")
        dec += struct.pack("<I", len(b)) + b

    os.makedirs(OUT, exist_ok=True)
    for name, data in [("corpus.bin", corpus), ("corpus_ids.bin", ids_out),
                       ("decode_cases.bin", dec)]:
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print("docs=%d corpus_bytes=%d ids=%d" % (len(docs), len(corpus), n_ids))


if __name__ == "__main__":
    main()

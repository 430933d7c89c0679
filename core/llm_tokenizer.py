"""LLM.get_tokenizer()'s tokenizer (llm.py): the model's own, read from its GGUF file, with the calls vLLM scripts
make of a Hugging Face tokenizer."""

from __future__ import annotations


class LLMTokenizer:
    """The model's tokenizer (read from its GGUF file) with the calls vLLM scripts make of get_tokenizer()'s
    Hugging Face tokenizer: encode, decode, apply_chat_template, eos_token_id, bos_token_id, vocab_size."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    @property
    def eos_token_id(self) -> int | None:
        return self._tokenizer.eos_id

    @property
    def bos_token_id(self) -> int | None:
        return self._tokenizer.bos_id

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.vocab_size

    def __len__(self) -> int:
        return self._tokenizer.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, special tokens in it recognised; BOS where the file asks for it."""
        return self._tokenizer.encode(text, special=True, add_special=add_special_tokens)

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, conversation: list[dict], tokenize: bool = True, add_generation_prompt: bool = False, **kwargs
    ) -> str | list[int]:
        """The conversation rendered with the model's template: its text, or with tokenize=True (Hugging Face's
        default) its token ids."""
        text = self._tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt, **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text

"""miro.core.tokenizers: tokenizers built from a GGUF's metadata: BPE and the chat template (tokenizer.py),
SentencePiece (spm.py) and WordPiece (wpm.py)."""

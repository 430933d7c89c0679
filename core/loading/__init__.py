"""miro.core.loading: from a file to a model: the GGUF reader, the model cache and aliases, a model's config and
tensors checked (correct or refused), the weight format chosen, and converting sentence-transformers folders."""

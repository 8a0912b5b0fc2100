"""Weight formats as files store them: GGUF's block types (ggml_types), a GGUF file's tensors
read in place (gguf_file), and a GGUF file as a model: config, tokenizer, weights
(gguf_model)."""

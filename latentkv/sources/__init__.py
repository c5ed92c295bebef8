"""What conversion, evaluation and healing read: source models (GGUF or a Hugging Face folder,
one tensor at a time: readers.py, gguf_reader.py, hf_reader.py, source_model.py, tensor_store.py),
their reference forward (reference.py), text corpora (corpus.py) and the chat set with its answers
(chat_data.py). Below convert/, eval/ and heal/, above the engine (chat answers of an MLA model
are generated with `LLM`)."""

"""The model and its chat format, shared by the engine, the agent and the trainer: chat template and tool-call
format (chat, toolcall), the local tokenizer (tokenizer), Hugging Face model folders (loading)."""

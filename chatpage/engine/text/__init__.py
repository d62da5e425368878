"""Text in and out: the tokenizer, chat templates, the detokenizer, thinking and tool-call
parsing, grammars for structured output."""

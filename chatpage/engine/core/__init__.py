"""The step's bookkeeping: the scheduler, the block manager over the block pool, sequences,
beams, stops and the updates a step sends; no torch model, no tokenizer files."""

"""The model side of Sangama: GGUF slices, the stage runtime, sampling, tokenizer, hardware.

`core` imports neither `net`, `coordinator`, asyncio nor Qt (DESIGN §3).
"""

"""The model side of Sangama: GGUF slices, the stage runtime, sampling, tokenizer, hardware.

`core` imports neither `net`, `coordinator`, asyncio nor Qt
(docs/architecture.md, "What may import what").
"""

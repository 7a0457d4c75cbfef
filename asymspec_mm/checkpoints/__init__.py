"""Checkpoint builders: Qwen-format folders from scratch (tokenizer, chat templates, processor, configs), small
random-weight pairs for tests and benchmarks, and real-layout stand-ins built from the real hub files
(``asymspec_mm/qwen_data``). They load through ``from_pretrained`` like any downloaded model.
"""

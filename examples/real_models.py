"""The paper's cross-modal pair on a GPU: Qwen3-VL-2B-Instruct drafter, Qwen3-32B verifier.

    python examples/real_models.py path/to/image.png "What is the value of the largest bar?"

Needs the two checkpoints (hub ids or local dirs) and a GPU with ~70 GB for bf16 weights; the
verifier spreads over all visible GPUs with verifier_device_map="auto".
"""

import sys

from asymspec_mm import AsymSpecConfig, AsymSpecPipeline

pipe = AsymSpecPipeline.from_pretrained(
    drafter="Qwen/Qwen3-VL-2B-Instruct", verifier="Qwen/Qwen3-32B", verifier_device_map="auto", ocr="auto",
)
res = pipe.generate(sys.argv[1], sys.argv[2], config=AsymSpecConfig(k=4, beta=1.0, gamma=0.5, max_new_tokens=512))
print(res.view.render(), "\n---\n", res.text)
print({k: res.stats[k] for k in ("acceptance_rate", "mean_accepted_length", "tokens_per_s", "vision_calls")})

"""The paper's cross-modal pair on a GPU: Qwen3-VL-2B-Instruct drafter, Qwen3-32B verifier.

    python examples/real_models.py path/to/image.png "What is the value of the largest bar?"

Needs the two checkpoints (hub ids or local dirs) and a GPU with ~70 GB for bf16 weights; the
verifier spreads over all visible GPUs with verifier_device_map="auto".
"""

import argparse
import sys

from asymspec_mm import AsymSpecConfig, AsymSpecPipeline
from asymspec_mm.base.errors import AsymSpecError

parser = argparse.ArgumentParser(description="Answer a question about an image with the paper's Qwen3 pair.")
parser.add_argument("image", help="image file")
parser.add_argument("question")
parser.add_argument("--drafter", default="Qwen/Qwen3-VL-2B-Instruct", help="[default: %(default)s]")
parser.add_argument("--verifier", default="Qwen/Qwen3-32B", help="[default: %(default)s]")
args = parser.parse_args()

try:
    pipe = AsymSpecPipeline.from_pretrained(
        drafter=args.drafter,
        verifier=args.verifier,
        verifier_device_map="auto",
        ocr="auto",
    )
except (OSError, AsymSpecError) as exc:  # missing checkpoints (offline, not downloaded) or a bad pair
    sys.exit(f"error: cannot load {args.drafter} + {args.verifier}: {str(exc).splitlines()[0]}")
res = pipe.generate(args.image, args.question, config=AsymSpecConfig(k=4, beta=1.0, gamma=0.5, max_new_tokens=512))
print(res.view.render(), "\n---\n", res.text)
print({k: res.stats[k] for k in ("acceptance_rate", "mean_accepted_length", "tokens_per_s", "vision_calls")})

"""Ask the bundled tiny pair about a bundled MiniVista chart and print how each token was chosen.

python examples/quickstart.py
"""

import json
from pathlib import Path

import asymspec_mm
from asymspec_mm import AsymSpecConfig, AsymSpecPipeline

data = Path(asymspec_mm.__file__).parent / "examples_data"
example = json.loads((data / "examples.json").read_text())[0]

pipe = AsymSpecPipeline.from_preset("tiny", ocr="none")
for method in ("floor", "drafter", "asymspec"):
    res = pipe.generate(
        data / example["image"],
        example["question"],
        caption=example["caption"],
        ocr=example["ocr"] or False,
        method=method,
        config=AsymSpecConfig(max_new_tokens=64),
    )
    print(f"{method:9s} {res.text!r}")

for ev in res.trace:  # the AsymSpec answer, token by token
    mark = {"accepted": "draft accepted", "fused": "fused at rejection", "bonus": "verifier bonus"}[ev.source]
    alone = pipe.tokenizer.decode([ev.verifier_argmax]) if ev.verifier_argmax is not None else ""
    print(
        f"{ev.text!r:>12} {mark:20s} p_verifier={ev.p_verifier:.2f}"
        + (f" jsd={ev.jsd:.3f} gamma_eff={ev.gamma_eff:.3f}" if ev.jsd is not None else "")
        + (f"   (verifier alone: {alone!r})" if ev.steered else "")
    )
print(res.stats)

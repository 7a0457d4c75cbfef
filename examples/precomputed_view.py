"""Feed a precomputed caption and OCR text (e.g. MathVista's official Bard caption and EasyOCR text)
instead of generating them.

    python examples/precomputed_view.py                                # a bundled example's stored view
    python examples/precomputed_view.py --pid 13 --preset tiny
    python examples/precomputed_view.py asymspec_mm/eval/mathvista/data 5 path/to/images/5.jpg

With a folder (the MathVista text data shipped with the package, as above, or MathVista's own
``data/texts/``), the view comes from its ``captions_bard.json`` and ``ocrs_easyocr.json`` through
:class:`captioning.StaticCaptioner` and :class:`captioning.StaticOCR`; without one, from the caption and
OCR text stored with the bundled MiniVista examples (``asymspec_mm/examples_data/examples.json``), chosen
by pid. The images are not shipped: they come with the Hugging Face dataset ``AI4Math/MathVista``.
"""

import argparse
import json
from pathlib import Path

import asymspec_mm
from asymspec_mm import AsymSpecPipeline
from captioning import StaticCaptioner, StaticOCR

BUNDLED = Path(asymspec_mm.__file__).parent / "examples_data"

parser = argparse.ArgumentParser(description="Answer with a precomputed compressed view (caption + OCR).")
parser.add_argument(
    "texts", nargs="?", type=Path, help="folder with captions_bard.json and ocrs_easyocr.json [default: the bundled examples]"
)
parser.add_argument("pid", nargs="?", help="problem id [default: the first bundled example's]")
parser.add_argument("image", nargs="?", help="the problem's image [default: the bundled example's]")
parser.add_argument("--pid", dest="pid_option", help="problem id, as an option (for the bundled examples)")
parser.add_argument("--question", help="[default: the bundled example's question, or 'What is shown in the figure?']")
parser.add_argument("--preset", default="auto", help="tiny | qwen3 | auto [default: %(default)s]")
parser.add_argument("--max-new-tokens", type=int, default=512, help="[default: %(default)s]")
args = parser.parse_args()
pid = args.pid_option or args.pid

if args.texts is None:
    examples = {str(ex["pid"]): ex for ex in json.loads((BUNDLED / "examples.json").read_text(encoding="utf-8"))}
    pid = pid or next(iter(examples))
    if pid not in examples:
        parser.error(f"no bundled example has pid {pid}; choose one of {', '.join(examples)}")
    example = examples[pid]
    image = args.image or BUNDLED / example["image"]
    question = args.question or example["question"]
    caption, ocr_text = example["caption"], example["ocr"]
else:
    if pid is None or args.image is None:
        parser.error("with a texts folder, give the problem id and its image")
    image = args.image
    question = args.question or "What is shown in the figure?"
    caption = StaticCaptioner(args.texts / "captions_bard.json", fallback="").caption_for(pid)
    ocr_text = StaticOCR(args.texts / "ocrs_easyocr.json", fallback="").text_for(pid)

# The view is given, so no OCR engine is needed.
pipe = AsymSpecPipeline.from_preset(args.preset, ocr="none")
res = pipe.generate(image, question, caption=caption, ocr=ocr_text or False, max_new_tokens=args.max_new_tokens)
print(res.text)

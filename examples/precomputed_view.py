"""Feed MathVista's official Bard caption and EasyOCR text instead of generating them.

    python examples/precomputed_view.py ../shared/mathvista 5 path/to/images/5.jpg
"""

import sys
from pathlib import Path

from asymspec_mm import AsymSpecPipeline
from captioning import StaticCaptioner, StaticOCR

root, pid, image = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
captions = StaticCaptioner(root / "captions_bard.json", fallback="")
ocr = StaticOCR(root / "ocrs_easyocr.json", fallback="")
pipe = AsymSpecPipeline.from_preset("auto")
res = pipe.generate(image, "What is shown in the figure?", caption=captions.caption_for(pid),
                    ocr=ocr.text_for(pid) or False)
print(res.text)

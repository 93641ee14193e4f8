"""Image descriptions (the vision descriptor): what an image decays to at an epoch and what recall shows."""

from .client import DEFAULT_PROMPT, VisionClient, VisionError
from .describer import DescriberStats, DescriptionView, ImageDescriber
from .factory import make_describer
from .intake import intake_images

__all__ = [
    "DEFAULT_PROMPT",
    "DescriberStats",
    "DescriptionView",
    "ImageDescriber",
    "VisionClient",
    "VisionError",
    "intake_images",
    "make_describer",
]

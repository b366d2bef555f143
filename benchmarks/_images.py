"""Real photographs for calibrating and judging int8: scikit-image's wheel ships sample pictures
(`skimage/data/`), fetched once into the zoo cache and checked by sha256 (PyPI only; nothing of
scikit-image is installed or imported). Different pictures calibrate/select and judge."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mcp_compiler.manifest import Source
from mcp_compiler.zoo import default_cache, fetch

PACKAGE, VERSION = "scikit-image", "0.26.0"
SHA256 = {
    "astronaut.png": "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
    "chelsea.png": "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
    "coffee.png": "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
    "rocket.jpg": "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c",
    "motorcycle_left.png": "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179",
    "retina.jpg": "38a07f36f27f095e818aea7b96d34202c05176d30253c66733f2e00379e9e0e6",
    "ihc.png": "f8dd1aa387ddd1f49d8ad13b50921b237df8e9b262606d258770687b0ef93cef",
    "logo.png": "f2c57fe8af089f08b5ba523d95573c26e62904ac5967f4c8851b27d033690168",
    # judging only
    "motorcycle_right.png": "5fc913ae870e42a4b662314bc904d1786bcad8e2f0b9b67dba5a229406357797",
    "hubble_deep_field.jpg": "3a19c5dd8a927a9334bb1229a6d63711b1c0c767fb27e2286e7c84a3e2c2f5f4",
    "color.png": "7d2df993de2b4fa2a78e04e5df8050f49a9c511aa75e59ab3bd56ac9c98aef7e",
    "grass.png": "b6b6022426b38936c43a4ac09635cd78af074e90f42ffa8227ac8b7452d39f89",
    "gravel.png": "c48615b451bf1e606fbd72c0aa9f8cc0f068ab7111ef7d93bb9b0f2586440c12",
    "page.png": "341a6f0a61557662b02734a9b6e56ec33a915b2c41886b97509dedf2a43b47a3",
    "text.png": "bd84aa3a6e3c9887850d45d606c96b2e59433fbef50338570b63c319e668e6d1",
    "camera.png": "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a",
}
CALIBRATE = list(SHA256)[:8]    # even ones calibrate, odd ones select (the int8 pass splits them)
JUDGE = list(SHA256)[8:]


def picture(name: str) -> np.ndarray:
    """The picture as uint8 RGB [H, W, 3]."""
    from PIL import Image

    path = fetch(Source(package=PACKAGE, version=VERSION, member=f"skimage/data/{name}", sha256=SHA256[name]),
                 default_cache())
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def resized(name: str, h: int, w: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(picture(name)).resize((w, h), Image.BILINEAR)).astype(np.float32)


def write_samples(folder: Path, names: list[str], make) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, n in enumerate(names):
        np.savez(folder / f"{i:02d}_{Path(n).stem}.npz", **make(n))
    return folder

"""model_fingerprint: a content key, the same for the same weights in any folder."""
import os

from grpo_core.modeling import loading as models
from grpo_core.modeling.loading import model_fingerprint


def _folder(path, weights: bytes, args: bytes):
    path.mkdir()
    (path / "config.json").write_text('{"hidden_size": 8}')
    (path / "model.safetensors").write_bytes(weights)
    (path / "training_args.bin").write_bytes(args)  # pickled args: holds the output_dir
    return str(path)


def test_same_weights_same_key_anywhere(tmp_path, monkeypatch):
    for limit in (1 << 30, 1000):  # whole-file hash, and sampled chunks for big files
        monkeypatch.setattr(models, "_HASH_LIMIT", limit)
        w = os.urandom(300_000)
        a = _folder(tmp_path / f"a{limit}", w, b"output_dir=/x/a")
        b = _folder(tmp_path / f"b{limit}", w, b"output_dir=/y/b")
        os.utime(tmp_path / f"b{limit}" / "model.safetensors", (0, 0))  # another mtime
        assert model_fingerprint(a) == model_fingerprint(b)
        changed = bytearray(w)
        changed[0] ^= 1  # the first chunk is always read
        c = _folder(tmp_path / f"c{limit}", bytes(changed), b"")
        assert model_fingerprint(c) != model_fingerprint(a)
    assert model_fingerprint("org/model") == model_fingerprint("org/model") != model_fingerprint("org/other")

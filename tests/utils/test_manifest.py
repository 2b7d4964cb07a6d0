"""The step manifest on its own: every file with size and CRC-32; what each kind of damage is reported as."""
import json
import zlib

import pytest

from verl.utils.checkpoint.manifest import MANIFEST_FILE, DamagedCheckpointError, verify, write_manifest


@pytest.fixture
def step(tmp_path):
    (tmp_path / "actor" / "huggingface").mkdir(parents=True)
    (tmp_path / "actor" / "model.pt").write_bytes(b"m" * 5000)
    (tmp_path / "actor" / "huggingface" / "config.json").write_text("{}")
    (tmp_path / "actor.partial").mkdir()                     # a leftover of an interrupted save: not listed
    (tmp_path / "actor.partial" / "model.pt").write_bytes(b"x")
    (tmp_path / "data.pt").write_bytes(b"d" * 100)
    write_manifest(str(tmp_path))
    return tmp_path


def test_every_file_is_listed_with_size_and_crc(step):
    files = json.loads((step / MANIFEST_FILE).read_text())["files"]
    assert sorted(files) == ["actor/huggingface/config.json", "actor/model.pt", "data.pt"]
    assert files["actor/model.pt"] == {"size": 5000, "crc32": f"{zlib.crc32(b'm' * 5000):08x}"}
    verify(str(step))


def test_each_kind_of_damage_names_the_file(step):
    (step / "data.pt").write_bytes(b"d" * 50)
    with pytest.raises(DamagedCheckpointError, match=r"data\.pt: it has 50 bytes, the manifest says 100"):
        verify(str(step))
    (step / "data.pt").write_bytes(b"e" * 100)                  # same size, other bytes
    verify(str(step), checksums=False)                         # the sizes-only check cannot see it
    with pytest.raises(DamagedCheckpointError, match=r"data\.pt: its CRC-32 is"):
        verify(str(step))
    (step / "data.pt").write_bytes(b"d" * 100)
    (step / "actor" / "huggingface" / "config.json").unlink()
    with pytest.raises(DamagedCheckpointError, match=r"config\.json: it is listed in the manifest but missing"):
        verify(str(step))


def test_a_garbled_manifest_is_damage_and_no_manifest_is_not_checked(step, tmp_path_factory):
    (step / MANIFEST_FILE).write_text("{")
    with pytest.raises(DamagedCheckpointError, match="the manifest cannot be read"):
        verify(str(step))
    (step / MANIFEST_FILE).unlink()
    verify(str(step))                                          # a checkpoint from before manifests

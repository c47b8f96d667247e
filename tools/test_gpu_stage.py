import hashlib

from tools.gpu_stage import split


def test_split_pieces_join_back_to_the_file_and_carry_its_checksum():
    data = bytes(range(256)) * 9000  # 2.2 MiB: three pieces
    items = split("train/t/shard-0000.safetensors", data)
    checksum, *pieces = items
    assert checksum == (
        "train/t/shard-0000.safetensors.sha256",
        f"{hashlib.sha256(data).hexdigest()}  shard-0000.safetensors\n".encode(),
    )
    assert [name for name, _ in pieces] == [f"train/t/shard-0000.safetensors.part{i:04d}" for i in range(3)]
    assert all(len(piece) <= 1024 * 1024 for _, piece in pieces)
    assert b"".join(piece for _, piece in sorted(pieces)) == data

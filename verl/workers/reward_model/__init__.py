"""The sequence-classification reward model: its inputs (`inputs`) and its worker (`worker`)."""

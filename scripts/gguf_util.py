"""GGUF helpers without torch (make_small_model.py, bench_models.py, gemma3_fixtures.py; fixture_lib.py
re-exports them): copying tokenizer metadata, finishing a file, the fixtures' logits measure."""
import gguf
import numpy as np


def field_value(field):
    """A reader field as the value GGUFWriter.add_key_value takes, with its (type, sub_type)."""
    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [str(bytes(field.parts[i]), "utf-8") for i in field.data], vtype, sub
        return [field.parts[i].tolist()[0] for i in field.data], vtype, sub
    if vtype == gguf.GGUFValueType.STRING:
        return str(bytes(field.parts[-1]), "utf-8"), vtype, None
    return field.parts[-1].tolist()[0], vtype, None


def copy_tokenizer(reader, writer, pad_to=None):
    """Every tokenizer.* key of `reader` into `writer`; returns the vocabulary size written.

    pad_to: grow the vocabulary to this many tokens with control tokens "<|pad_N|>" (score 0), as
    converters pad a vocabulary to the embedding's row count.
    """
    values = {}
    for name, field in reader.fields.items():
        if name.startswith("tokenizer."):
            values[name] = field_value(field)
    tokens = values["tokenizer.ggml.tokens"][0]
    n = len(tokens)
    if pad_to is not None and pad_to > n:
        extra = pad_to - n
        tokens.extend(f"<|pad_{i}|>" for i in range(extra))
        if "tokenizer.ggml.token_type" in values:
            values["tokenizer.ggml.token_type"][0].extend([3] * extra)  # llama.cpp's CONTROL
        if "tokenizer.ggml.scores" in values:
            values["tokenizer.ggml.scores"][0].extend([0.0] * extra)
    for name, (value, vtype, sub) in values.items():
        writer.add_key_value(name, value, vtype, sub_type=sub)
    return len(tokens)


def finish_gguf(w):
    """Header, metadata and tensors of a GGUFWriter whose tensors were all added, then closed."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def rel_error(got, want):
    """max over rows of max|got - want| / max|want| (the tests' measure)."""
    return float((np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max())

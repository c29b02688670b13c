#!/usr/bin/env python3
"""A float32 copy of a GGUF: every tensor dequantized (gguf-py's reference dequantizers), every
metadata key kept, general.file_type ALL_F32. With it kvlab's matrix products run on the very
float32 weights transformers runs (no weight rounding, no 8-bit activations), so what is left
between kvlab's and kvpress's kept rows is summation order alone."""
import sys

import numpy as np
import gguf


def main():
    src, dst = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch=arch)
    for f in r.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        value = f.contents()
        if f.name == gguf.Keys.General.FILE_TYPE:
            value = int(gguf.LlamaFileType.ALL_F32)
        vt = f.types[0]
        w.add_key_value(f.name, value, vt, sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, data.reshape([int(x) for x in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()

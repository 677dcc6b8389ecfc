"""Low-bit inference: weight-only int8 / int4 quantization of Linear layers
(:func:`quantize_weights`) and the quantized KV cache of generation (``kv``)."""

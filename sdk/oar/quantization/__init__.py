"""Low-bit inference: weight-only int8 / int4 quantization of Linear layers
(:func:`quantize_weights`, optionally Hadamard-rotated) and the quantized KV cache
of generation (``oar.quantization.kv``).

    oar.quantization.quantize_weights(model, bits=4, group_size=64, rotate="hadamard")
    oar.save(oar.quantization.checkpoint(model), path)
    oar.quantization.restore(other_quantized_model, oar.load(path))
"""

from oar.quantization.weights import (QuantizationSchemeError, QuantizedLinear, QuantScheme, checkpoint,
                                      dequantize_array, hadamard_rotation, quantize_array, quantize_weights,
                                      restore, scheme_of)

__all__ = ["QuantScheme", "QuantizedLinear", "QuantizationSchemeError", "quantize_weights", "scheme_of",
           "checkpoint", "restore", "hadamard_rotation", "quantize_array", "dequantize_array"]

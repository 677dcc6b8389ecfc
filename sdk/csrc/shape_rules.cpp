#include "shape_rules.hpp"

#include <algorithm>
#include <vector>

#include "geometry.hpp"
#include "scalars.hpp"

namespace oar {

// ---- shapes ------------------------------------------------------------------------------------------------

[[noreturn]] void shape_error(const std::string& message) { raise_oar("ShapeError", message); }
[[noreturn]] void dtype_error(const std::string& message) { raise_oar("DTypeError", message); }

int64_t wrap_dim(int64_t dim, size_t ndim, const std::string& what) {
  int64_t n = static_cast<int64_t>(ndim);
  int64_t span = std::max<int64_t>(n, 1);
  if (dim < -span || dim >= span) {
    throw py::index_error(what + ": dim " + std::to_string(dim) + " is out of range for a " + std::to_string(ndim) +
                          "-d tensor (expected " + std::to_string(-span) + " to " + std::to_string(span - 1) + ")");
  }
  return dim < 0 ? dim + span : dim;
}

namespace {

// Broadcast shape of several shapes (numpy rules), or a ShapeError naming the inputs.
Dims broadcast_shapes(const OpSchema& op, const TensorImpl* const* impls, const size_t* which, size_t count) {
  size_t ndim = 0;
  for (size_t k = 0; k < count; ++k) ndim = std::max(ndim, impls[k]->ndim());
  Dims out(ndim, 1);
  for (size_t k = 0; k < count; ++k) {
    const Dims& shape = impls[k]->shape;
    size_t lead = ndim - shape.size();
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t extent = shape[d];
      int64_t& target = out[lead + d];
      if (extent == target || extent == 1) continue;
      if (target == 1) {
        target = extent;
        continue;
      }
      std::string text = op.name + ": shapes do not broadcast:";
      for (size_t j = 0; j < count; ++j) {
        text += std::string(j ? "," : "") + " '" + op.inputs[which[j]].name + "' " + shape_text(impls[j]->shape);
      }
      shape_error(text);
    }
  }
  return out;
}

}  // namespace

Dims broadcast_strides(const TensorImpl& x, const Dims& shape) {
  Dims strides(shape.size(), 0);
  size_t lead = shape.size() - x.ndim();
  for (size_t d = 0; d < x.ndim(); ++d) {
    strides[lead + d] = (x.shape[d] == shape[lead + d]) ? x.strides[d] : 0;
  }
  return strides;
}

Dims dims_from(py::handle sequence, const std::string& what) {
  Dims dims;
  for (py::handle item : py::reinterpret_borrow<py::iterable>(sequence)) {
    if (!is_integer_object(item.ptr())) throw py::type_error(what + ": shapes are lists of ints");
    dims.push_back(as_int64(item.ptr()));
  }
  return dims;
}

// ---- the nn, index and misc ops, by name --------------------------------------------------------

namespace {

}  // namespace

// The inputs and attrs a named rule reads (absent optional inputs are left out of inputs).
struct RuleArgs {
  const OpSchema& op;
  const TensorImpl* const* inputs;
  size_t num_inputs;
  const CallAttrs& attrs;

  const TensorImpl& input(size_t k) const { return *inputs[k]; }
  const AttrValue& attr(const char* name) const {
    int k = op.attr_position(name);
    if (k < 0) throw py::type_error(op.name + ": the shape rule needs an attr '" + name + "'");
    return *attrs.values[k];
  }
  int64_t int_attr(const char* name) const { return attr(name).i; }
  const std::vector<int64_t>& ints_attr(const char* name) const { return attr(name).ints; }
};

namespace {

std::string ints_text(const std::vector<int64_t>& values) {  // Python's list repr: "[1, 2]"
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

Dims concat_dims(const Dims& head, std::initializer_list<int64_t> tail) {
  Dims out = head;
  for (int64_t value : tail) out.push_back(value);
  return out;
}

void need_ndim(const std::string& op, const char* name, const TensorImpl& x, size_t ndim) {
  if (x.ndim() != ndim) {
    shape_error(op + ": input '" + name + "' must be " + std::to_string(ndim) + "-d, got shape " + shape_text(x.shape));
  }
}

// dim wrapped into [0, max(ndim, 1)); IndexError naming the op (without wrap_dim's expected range).
int64_t rule_dim(const std::string& op, const TensorImpl& x, int64_t dim) {
  int64_t ndim = std::max<int64_t>(static_cast<int64_t>(x.ndim()), 1);
  if (dim < -ndim || dim >= ndim) {
    throw py::index_error(op + ": dim " + std::to_string(dim) + " is out of range for a " + std::to_string(x.ndim()) +
                          "-d tensor");
  }
  return dim < 0 ? dim + ndim : dim;
}

// A pair attr (kernel_size, stride, padding, dilation): 1 entry means both, none the default.
WindowPair pair_attr(const std::string& op, const char* name, const std::vector<int64_t>& value,
                     const std::vector<int64_t>& fallback = {}) {
  try {
    return window_pair(value, fallback);
  } catch (const std::invalid_argument&) {
    shape_error(op + ": attr '" + name + "' must have 1 or 2 entries, got " + ints_text(value));
  }
}

int64_t window_out(const std::string& op, int64_t size, int64_t kernel, int64_t stride, int64_t padding,
                   int64_t dilation = 1) {
  if (stride <= 0 || kernel <= 0 || dilation <= 0 || padding < 0) {
    shape_error(op + ": kernel, stride and dilation must be positive and padding >= 0");
  }
  int64_t out = window_output_size(size, kernel, stride, padding, dilation);
  if (out <= 0) {
    shape_error(op + ": the window (" + std::to_string(kernel) + ", dilation " + std::to_string(dilation) +
                ") does not fit an input of size " + std::to_string(size) + " with padding " + std::to_string(padding));
  }
  return out;
}

Dims conv2d_rule(const RuleArgs& args) {
  const TensorImpl& x = args.input(0);
  const TensorImpl& weight = args.input(1);
  need_ndim("conv2d", "x", x, 4);
  need_ndim("conv2d", "weight", weight, 4);
  int64_t groups = args.int_attr("groups");
  int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3];
  int64_t o = weight.shape[0], cg = weight.shape[1], kh = weight.shape[2], kw = weight.shape[3];
  if (groups <= 0 || c % groups || o % groups) {
    shape_error("conv2d: groups=" + std::to_string(groups) + " must divide the input channels " + std::to_string(c) +
                " and output channels " + std::to_string(o));
  }
  if (cg * groups != c) {
    shape_error("conv2d: weight " + shape_text(weight.shape) + " expects " + std::to_string(cg * groups) +
                " input channels (C/groups = " + std::to_string(cg) + "), x has " + std::to_string(c));
  }
  if (args.num_inputs > 2 && args.input(2).shape != Dims(1, o)) {
    shape_error("conv2d: bias must have shape (" + std::to_string(o) + ",), got " + shape_text(args.input(2).shape));
  }
  WindowPair stride = pair_attr("conv2d", "stride", args.ints_attr("stride"));
  WindowPair padding = pair_attr("conv2d", "padding", args.ints_attr("padding"));
  WindowPair dilation = pair_attr("conv2d", "dilation", args.ints_attr("dilation"));
  return Dims{n, o, window_out("conv2d", h, kh, stride.h, padding.h, dilation.h),
              window_out("conv2d", w, kw, stride.w, padding.w, dilation.w)};
}

Dims shape_attr_rule(const std::string& op, const char* attr, const std::vector<int64_t>& shape) {
  if (shape.size() != 4) {
    shape_error(op + ": " + attr + " must have 4 entries, got " + ints_text(shape));
  }
  return Dims(shape.data(), shape.size());
}

Dims conv2d_backward_input_rule(const RuleArgs& args) {
  return shape_attr_rule("conv2d_backward_input", "input_shape", args.ints_attr("input_shape"));
}

Dims conv2d_backward_weight_rule(const RuleArgs& args) {
  return shape_attr_rule("conv2d_backward_weight", "weight_shape", args.ints_attr("weight_shape"));
}

Dims pool_shape(const std::string& op, const TensorImpl& x, const RuleArgs& args) {
  need_ndim(op, "x", x, 4);
  WindowPair kernel = pair_attr(op, "kernel_size", args.ints_attr("kernel_size"));
  WindowPair stride = pair_attr(op, "stride", args.ints_attr("stride"), {kernel.h, kernel.w});
  WindowPair padding = pair_attr(op, "padding", args.ints_attr("padding"));
  if (padding.h * 2 > kernel.h || padding.w * 2 > kernel.w) {
    shape_error(op + ": padding (" + std::to_string(padding.h) + ", " + std::to_string(padding.w) +
                ") must be at most half the kernel (" + std::to_string(kernel.h) + ", " + std::to_string(kernel.w) + ")");
  }
  return Dims{x.shape[0], x.shape[1], window_out(op, x.shape[2], kernel.h, stride.h, padding.h),
              window_out(op, x.shape[3], kernel.w, stride.w, padding.w)};
}

Dims pool_rule(const RuleArgs& args) { return pool_shape(args.op.name, args.input(0), args); }

Dims pool_backward_rule(const RuleArgs& args) {
  const std::string& op = args.op.name;
  const TensorImpl& grad = args.input(0);
  const TensorImpl& x = args.input(1);
  Dims expected = pool_shape(op.substr(0, op.size() - std::string("_backward").size()), x, args);
  if (grad.shape != expected) {
    shape_error(op + ": grad has shape " + shape_text(grad.shape) + ", the forward output of x " + shape_text(x.shape) +
                " has " + shape_text(expected));
  }
  return x.shape;
}

// layer_norm, rms_norm (x first) and their input gradients (grad, x, weight).
Dims norm_rule(const RuleArgs& args) {
  const std::string& op = args.op.name;
  size_t x_index = args.op.inputs.size() > 0 && args.op.inputs[0].name == "grad" ? 1 : 0;
  const TensorImpl& x = args.input(x_index);
  int64_t k = args.int_attr("normalized_ndim");
  if (k < 1 || k > static_cast<int64_t>(x.ndim())) {
    shape_error(op + ": normalized_ndim=" + std::to_string(k) + " must be between 1 and x's ndim " +
                std::to_string(x.ndim()));
  }
  Dims normalized(x.shape.data() + x.ndim() - k, static_cast<size_t>(k));
  for (size_t j = x_index + 1; j < args.num_inputs; ++j) {
    if (args.input(j).shape != normalized) {
      shape_error(op + ": input '" + args.op.inputs[j].name + "' must have the normalized shape " +
                  shape_text(normalized) + ", got " + shape_text(args.input(j).shape));
    }
  }
  if (x_index && args.input(0).shape != x.shape) {
    shape_error(op + ": grad has shape " + shape_text(args.input(0).shape) + ", x has " + shape_text(x.shape));
  }
  return x.shape;
}

Dims embedding_rule(const RuleArgs& args) {
  const TensorImpl& weight = args.input(0);
  need_ndim("embedding", "weight", weight, 2);
  return concat_dims(args.input(1).shape, {weight.shape[1]});
}

// x [..., K], qweight [N, K or K/2 (4 bits)], scales/zeros [N, K/group_size] -> [..., N].
Dims weight_only_linear_rule(const RuleArgs& args) {
  const std::string op = "weight_only_linear";
  const TensorImpl& x = args.input(0);
  const TensorImpl& qweight = args.input(1);
  if (x.ndim() < 1) shape_error(op + ": x must have at least 1 dim, got shape " + shape_text(x.shape));
  need_ndim(op, "qweight", qweight, 2);
  int64_t bits = args.int_attr("bits"), group = args.int_attr("group_size");
  if (bits != 4 && bits != 8) shape_error(op + ": bits must be 4 or 8, not " + std::to_string(bits));
  int64_t k = x.shape[x.ndim() - 1], n = qweight.shape[0];
  if (group <= 0 || k % group || (bits == 4 && group % 2)) {
    shape_error(op + ": group_size " + std::to_string(group) + " must be positive, divide in_features " +
                std::to_string(k) + (bits == 4 ? " and be even" : ""));
  }
  Dims packed{n, bits == 8 ? k : k / 2}, grouped{n, k / group};
  if (qweight.shape != packed) {
    shape_error(op + ": qweight must have shape " + shape_text(packed) + " for x " + shape_text(x.shape) +
                " and bits=" + std::to_string(bits) + ", got " + shape_text(qweight.shape));
  }
  for (size_t j = 2; j < 4; ++j) {
    if (args.input(j).shape != grouped) {
      shape_error(op + ": input '" + args.op.inputs[j].name + "' must have shape " + shape_text(grouped) + ", got " +
                  shape_text(args.input(j).shape));
    }
  }
  Dims out = x.shape;
  out[x.ndim() - 1] = n;
  return out;
}

Dims cross_entropy_shape(const std::string& op, const TensorImpl& logits, const TensorImpl& target,
                         const RuleArgs& args) {
  need_ndim(op, "logits", logits, 2);
  if (target.shape != Dims(1, logits.shape[0])) {
    shape_error(op + ": target must have shape (" + std::to_string(logits.shape[0]) + ",), got " +
                shape_text(target.shape));
  }
  const std::string& reduction = args.attr("reduction").s;
  if (reduction != "mean" && reduction != "sum" && reduction != "none") {
    shape_error(op + ": reduction must be 'mean', 'sum' or 'none', not " +
                py::repr(py::str(reduction)).cast<std::string>());
  }
  return reduction == "none" ? Dims(1, logits.shape[0]) : Dims();
}

Dims cross_entropy_rule(const RuleArgs& args) {
  return cross_entropy_shape("cross_entropy", args.input(0), args.input(1), args);
}

Dims cross_entropy_backward_rule(const RuleArgs& args) {
  const TensorImpl& grad = args.input(0);
  Dims expected = cross_entropy_shape("cross_entropy", args.input(1), args.input(2), args);
  if (grad.shape != expected) {
    shape_error("cross_entropy_backward: grad has shape " + shape_text(grad.shape) + ", expected " +
                shape_text(expected));
  }
  return args.input(1).shape;
}

Dims gather_rule(const RuleArgs& args) {
  const TensorImpl& x = args.input(0);
  const TensorImpl& indices = args.input(1);
  rule_dim("gather", x, args.int_attr("dim"));
  if (indices.ndim() != x.ndim()) {
    shape_error("gather: indices must have x's ndim " + std::to_string(x.ndim()) + ", got shape " +
                shape_text(indices.shape));
  }
  return indices.shape;
}

Dims scatter_rule(const RuleArgs& args) {
  const std::string& op = args.op.name;
  const TensorImpl& x = args.input(0);
  const TensorImpl& indices = args.input(1);
  const TensorImpl& source = args.input(2);
  rule_dim(op, x, args.int_attr("dim"));
  if (indices.ndim() != x.ndim() || source.ndim() != x.ndim()) {
    shape_error(op + ": x, indices and source must have one ndim, got " + shape_text(x.shape) + ", " +
                shape_text(indices.shape) + ", " + shape_text(source.shape));
  }
  for (size_t d = 0; d < indices.ndim(); ++d) {
    if (indices.shape[d] > source.shape[d]) {
      shape_error(op + ": indices " + shape_text(indices.shape) + " must not be larger than source " +
                  shape_text(source.shape) + " in any dim");
    }
  }
  return x.shape;
}

Dims index_select_rule(const RuleArgs& args) {
  const TensorImpl& x = args.input(0);
  const TensorImpl& indices = args.input(1);
  if (x.ndim() == 0) shape_error("index_select: x must have at least 1 dim");
  int64_t dim = rule_dim("index_select", x, args.int_attr("dim"));
  need_ndim("index_select", "indices", indices, 1);
  Dims shape = x.shape;
  shape[dim] = indices.shape[0];
  return shape;
}

Dims index_add_rule(const RuleArgs& args) {
  const TensorImpl& x = args.input(0);
  const TensorImpl& source = args.input(1);
  const TensorImpl& indices = args.input(2);
  int64_t dim = rule_dim("index_add", x, args.int_attr("dim"));
  need_ndim("index_add", "indices", indices, 1);
  Dims expected = x.shape;
  if (!expected.empty()) expected[dim] = indices.shape[0];
  if (source.shape != expected) {
    shape_error("index_add: source must have shape " + shape_text(expected) + " (x's with dim " + std::to_string(dim) +
                " of len(indices)), got " + shape_text(source.shape));
  }
  return x.shape;
}

// index / index_put: indices [k, *B] address dims dim .. dim+k-1 of x; the result is x's shape with them replaced by B.
Dims advanced_index_shape(const RuleArgs& args) {
  const std::string& op = args.op.name;
  const TensorImpl& x = args.input(0);
  const TensorImpl& indices = args.input(1);
  if (x.ndim() == 0) shape_error(op + ": x must have at least 1 dim");
  int64_t dim = rule_dim(op, x, args.int_attr("dim"));
  if (indices.ndim() == 0 || indices.shape[0] == 0) {
    shape_error(op + ": indices must be [k, *B] with k >= 1 index tensors stacked, got shape " +
                shape_text(indices.shape));
  }
  int64_t count = indices.shape[0];
  if (dim + count > static_cast<int64_t>(x.ndim())) {
    shape_error(op + ": " + std::to_string(count) + " index tensors from dim " + std::to_string(dim) +
                " need more dims than x's shape " + shape_text(x.shape));
  }
  Dims shape;
  for (int64_t d = 0; d < dim; ++d) shape.push_back(x.shape[d]);
  for (size_t d = 1; d < indices.ndim(); ++d) shape.push_back(indices.shape[d]);
  for (size_t d = static_cast<size_t>(dim + count); d < x.ndim(); ++d) shape.push_back(x.shape[d]);
  return shape;
}

Dims index_rule(const RuleArgs& args) { return advanced_index_shape(args); }

Dims index_put_rule(const RuleArgs& args) {
  Dims expected = advanced_index_shape(args);
  const TensorImpl& values = args.input(2);
  if (values.shape != expected) {
    shape_error("index_put: values must have the indexed shape " + shape_text(expected) + ", got " +
                shape_text(values.shape));
  }
  return args.input(0).shape;
}

Dims one_hot_rule(const RuleArgs& args) {
  int64_t classes = args.int_attr("num_classes");
  if (classes < 0) shape_error("one_hot: num_classes must be >= 0, got " + std::to_string(classes));
  // The kernel never runs for an empty output, so the "index < num_classes" check of its values is made here.
  if (classes == 0 && args.input(0).numel() > 0) {
    throw py::index_error("one_hot: num_classes is 0, so every one of the " + std::to_string(args.input(0).numel()) +
                          " indices is out of range (class values must be smaller than num_classes)");
  }
  return concat_dims(args.input(0).shape, {classes});
}

Dims triangle_rule(const RuleArgs& args) {
  const TensorImpl& x = args.input(0);
  if (x.ndim() < 2) {
    shape_error(args.op.name + ": x must have at least 2 dims, got shape " + shape_text(x.shape));
  }
  return x.shape;
}

// ---- ops for real models (B): channel norms, adaptive pooling, resizing, padding -------------------------

// x [N, C, ...] and the [C] inputs from position first_channel_input on (mean, var, weight, bias).
void need_channel_inputs(const RuleArgs& args, size_t x_index, size_t first_channel_input) {
  const std::string& op = args.op.name;
  const TensorImpl& x = args.input(x_index);
  if (x.ndim() < 2) shape_error(op + ": x must be [N, C, ...], got shape " + shape_text(x.shape));
  for (size_t j = first_channel_input; j < args.num_inputs; ++j) {
    if (args.input(j).shape != Dims{x.shape[1]}) {
      shape_error(op + ": input '" + args.op.inputs[j].name + "' must have shape (" + std::to_string(x.shape[1]) +
                  ",) (x's channels), got " + shape_text(args.input(j).shape));
    }
  }
  if (x_index && args.input(0).shape != x.shape) {
    shape_error(op + ": grad has shape " + shape_text(args.input(0).shape) + ", x has " + shape_text(x.shape));
  }
}

Dims batch_norm_stats_rule(const RuleArgs& args) {
  need_channel_inputs(args, 0, 1);
  return Dims{2, args.input(0).shape[1]};
}

// batch_norm(x, stats, weight?, bias?) and batch_norm_backward(grad, x, stats, weight?): stats [2, C].
Dims batch_norm_rule(const RuleArgs& args) {
  size_t x_index = args.op.inputs[0].name == "grad" ? 1 : 0;
  need_channel_inputs(args, x_index, x_index + 2);
  const TensorImpl& x = args.input(x_index);
  if (args.input(x_index + 1).shape != Dims{2, x.shape[1]}) {
    shape_error(args.op.name + ": input 'stats' must have shape (2, " + std::to_string(x.shape[1]) +
                ") ([mean; var] per channel of x " + shape_text(x.shape) + "), got " +
                shape_text(args.input(x_index + 1).shape));
  }
  return x.shape;
}

Dims group_norm_rule(const RuleArgs& args) {
  size_t x_index = args.op.inputs[0].name == "grad" ? 1 : 0;
  need_channel_inputs(args, x_index, x_index + 1);
  const TensorImpl& x = args.input(x_index);
  int64_t groups = args.int_attr("num_groups");
  if (groups <= 0 || x.shape[1] % groups) {
    shape_error(args.op.name + ": num_groups=" + std::to_string(groups) + " must be positive and divide the " +
                std::to_string(x.shape[1]) + " channels of x " + shape_text(x.shape));
  }
  return x.shape;
}

// [out_h, out_w], both positive.
WindowPair output_size_attr(const std::string& op, const std::vector<int64_t>& size) {
  if (size.size() != 2 || size[0] <= 0 || size[1] <= 0) {
    shape_error(op + ": attr 'output_size' must be 2 positive sizes, got " + ints_text(size));
  }
  return WindowPair{size[0], size[1]};
}

// x [N, C, H, W] (or [C, H, W] where allow_3d) with H, W > 0: x's shape with H, W replaced by output_size.
Dims resized_shape(const std::string& op, const Dims& x, const std::vector<int64_t>& output_size, bool allow_3d) {
  if (x.size() != 4 && !(allow_3d && x.size() == 3)) {
    shape_error(op + ": x must be " + (allow_3d ? "[N, C, H, W] or [C, H, W]" : "[N, C, H, W]") + ", got shape " +
                shape_text(x));
  }
  WindowPair size = output_size_attr(op, output_size);
  size_t n = x.size();
  if (x[n - 2] <= 0 || x[n - 1] <= 0) {
    shape_error(op + ": x's spatial dims must be non-empty, got shape " + shape_text(x));
  }
  Dims out = x;
  out[n - 2] = size.h;
  out[n - 1] = size.w;
  return out;
}

void need_scales(const std::string& op, const std::vector<double>& scales) {
  if (!scales.empty() && (scales.size() != 2 || !(scales[0] > 0) || !(scales[1] > 0))) {
    shape_error(op + ": attr 'scales' must be empty or 2 positive factors");
  }
}

Dims adaptive_pool_rule(const RuleArgs& args) {
  return resized_shape(args.op.name, args.input(0).shape, args.ints_attr("output_size"), true);
}

// The gradient of a resize: grad must be input_shape resized to grad's own last two dims.
Dims resize_backward_rule(const RuleArgs& args) {
  const std::string& op = args.op.name;
  const std::vector<int64_t>& input_shape = args.ints_attr("input_shape");
  bool adaptive = op.rfind("adaptive", 0) == 0;
  const TensorImpl& grad = args.input(0);
  Dims x(input_shape.data(), input_shape.size());
  if (grad.ndim() < 2) shape_error(op + ": grad must be [N, C, h, w], got shape " + shape_text(grad.shape));
  std::vector<int64_t> size{grad.shape[grad.ndim() - 2], grad.shape[grad.ndim() - 1]};
  if (resized_shape(op, x, size, adaptive) != grad.shape) {
    shape_error(op + ": grad " + shape_text(grad.shape) + " does not match input_shape " + ints_text(input_shape));
  }
  if (args.op.attr_position("scales") >= 0) need_scales(op, args.attr("scales").floats);
  return x;
}

Dims adaptive_max_backward_rule(const RuleArgs& args) {
  const std::string& op = args.op.name;
  const TensorImpl& grad = args.input(0);
  const TensorImpl& x = args.input(1);
  if (grad.ndim() != x.ndim() || grad.ndim() < 3) {
    shape_error(op + ": grad " + shape_text(grad.shape) + " does not match x " + shape_text(x.shape));
  }
  std::vector<int64_t> size{grad.shape[grad.ndim() - 2], grad.shape[grad.ndim() - 1]};
  if (resized_shape(op, x.shape, size, true) != grad.shape) {
    shape_error(op + ": grad " + shape_text(grad.shape) + " does not match x " + shape_text(x.shape));
  }
  return x.shape;
}

Dims upsample_rule(const RuleArgs& args) {
  need_scales(args.op.name, args.attr("scales").floats);
  return resized_shape(args.op.name, args.input(0).shape, args.ints_attr("output_size"), false);
}

// torch's F.pad: (before, after) pairs from the last dim backwards.
Dims padded_shape(const std::string& op, const Dims& x, const std::vector<int64_t>& pad, const std::string& mode) {
  if (pad.size() % 2 || pad.size() / 2 > x.size()) {
    shape_error(op + ": attr 'pad' " + ints_text(pad) + " must hold (before, after) pairs for at most " +
                std::to_string(x.size()) + " dims");
  }
  if (mode != "constant" && mode != "reflect" && mode != "replicate") {
    shape_error(op + ": mode is 'constant', 'reflect' or 'replicate', not '" + mode + "'");
  }
  Dims out = x;
  for (size_t k = 0; k < pad.size() / 2; ++k) {
    size_t d = x.size() - 1 - k;
    int64_t before = pad[2 * k], after = pad[2 * k + 1], n = x[d];
    if (mode != "constant" && (before < 0 || after < 0)) {
      shape_error(op + ": " + mode + " padding " + ints_text(pad) + " must not be negative");
    }
    if (mode == "reflect" && (before >= n || after >= n)) {
      shape_error(op + ": reflect padding (" + std::to_string(before) + ", " + std::to_string(after) +
                  ") must be less than dim " + std::to_string(d) + "'s size " + std::to_string(n));
    }
    if (mode == "replicate" && n == 0 && (before || after)) {
      shape_error(op + ": replicate padding needs a non-empty dim " + std::to_string(d));
    }
    out[d] = n + before + after;
    if (out[d] < 0) {
      shape_error(op + ": padding " + ints_text(pad) + " leaves dim " + std::to_string(d) + " of x " + shape_text(x) +
                  " with a negative size");
    }
  }
  return out;
}

Dims pad_rule(const RuleArgs& args) {
  return padded_shape("pad", args.input(0).shape, args.ints_attr("pad"), args.attr("mode").s);
}

Dims pad_backward_rule(const RuleArgs& args) {
  const std::vector<int64_t>& input_shape = args.ints_attr("input_shape");
  Dims x(input_shape.data(), input_shape.size());
  Dims expected = padded_shape("pad_backward", x, args.ints_attr("pad"), args.attr("mode").s);
  if (args.input(0).shape != expected) {
    shape_error("pad_backward: grad has shape " + shape_text(args.input(0).shape) + ", pad gives " +
                shape_text(expected) + " for input_shape " + ints_text(input_shape));
  }
  return x;
}

// Recurrent cells and their backward ops: every input is [N, k*H] with the same N and H (k per
// input in blocks); H comes from the previous state, the last input.
Dims cell_rule(const RuleArgs& args, const std::vector<int64_t>& blocks, int64_t out_blocks) {
  const TensorImpl& state = args.input(blocks.size() - 1);
  if (state.ndim() != 2) {
    shape_error(args.op.name + ": input '" + args.op.inputs[blocks.size() - 1].name + "' must be [N, H], got " +
                shape_text(state.shape));
  }
  int64_t n = state.shape[0], h = state.shape[1];
  for (size_t k = 0; k + 1 < blocks.size(); ++k) {
    if (args.input(k).shape != Dims{n, blocks[k] * h}) {
      shape_error(args.op.name + ": input '" + args.op.inputs[k].name + "' must have shape (" + std::to_string(n) +
                  ", " + std::to_string(blocks[k] * h) + ") for a state of shape " + shape_text(state.shape) +
                  ", got " + shape_text(args.input(k).shape));
    }
  }
  return Dims{n, out_blocks * h};
}

Dims lstm_cell_rule(const RuleArgs& args) { return cell_rule(args, {4, 1}, 2); }
Dims gru_cell_rule(const RuleArgs& args) { return cell_rule(args, {3, 3, 1}, 1); }
Dims lstm_cell_backward_rule(const RuleArgs& args) { return cell_rule(args, {2, 4, 1}, 5); }
Dims gru_cell_backward_rule(const RuleArgs& args) { return cell_rule(args, {1, 3, 3, 1}, 7); }

const std::pair<const char*, ShapeRuleFn> kNamedRules[] = {
    {"conv2d", conv2d_rule},
    {"conv2d_backward_input", conv2d_backward_input_rule},
    {"conv2d_backward_weight", conv2d_backward_weight_rule},
    {"max_pool2d", pool_rule},
    {"max_pool2d_indices", pool_rule},
    {"avg_pool2d", pool_rule},
    {"max_pool2d_backward", pool_backward_rule},
    {"avg_pool2d_backward", pool_backward_rule},
    {"layer_norm", norm_rule},
    {"layer_norm_backward_input", norm_rule},
    {"rms_norm", norm_rule},
    {"rms_norm_backward_input", norm_rule},
    {"embedding", embedding_rule},
    {"weight_only_linear", weight_only_linear_rule},
    {"cross_entropy", cross_entropy_rule},
    {"cross_entropy_backward", cross_entropy_backward_rule},
    {"gather", gather_rule},
    {"scatter", scatter_rule},
    {"scatter_add", scatter_rule},
    {"index_select", index_select_rule},
    {"index_add", index_add_rule},
    {"one_hot", one_hot_rule},
    {"index", index_rule},
    {"index_put", index_put_rule},
    {"tril", triangle_rule},
    {"triu", triangle_rule},
    {"batch_norm_stats", batch_norm_stats_rule},
    {"batch_norm", batch_norm_rule},
    {"batch_norm_backward", batch_norm_rule},
    {"group_norm", group_norm_rule},
    {"group_norm_backward", group_norm_rule},
    {"adaptive_avg_pool2d", adaptive_pool_rule},
    {"adaptive_max_pool2d", adaptive_pool_rule},
    {"adaptive_avg_pool2d_backward", resize_backward_rule},
    {"adaptive_max_pool2d_backward", adaptive_max_backward_rule},
    {"upsample_nearest2d", upsample_rule},
    {"upsample_bilinear2d", upsample_rule},
    {"upsample_nearest2d_backward", resize_backward_rule},
    {"upsample_bilinear2d_backward", resize_backward_rule},
    {"pad", pad_rule},
    {"pad_backward", pad_backward_rule},
    {"lstm_cell", lstm_cell_rule},
    {"gru_cell", gru_cell_rule},
    {"lstm_cell_backward", lstm_cell_backward_rule},
    {"gru_cell_backward", gru_cell_backward_rule},
};

}  // namespace

ShapeRuleFn named_shape_rule(const std::string& op_name) {
  for (auto& [name, rule] : kNamedRules) {
    if (op_name == name) return rule;
  }
  return nullptr;
}

void infer_shapes(const OpSchema& op, const TensorImpl* const* impls, size_t num_inputs,
                  const CallAttrs& attrs, InferredShapes& shapes) {
  size_t num_outputs = op.num_outputs;
  switch (op.kind) {
    case OpKind::Unary:
      shapes.out[0] = impls[0]->shape;
      break;
    case OpKind::Binary:
    case OpKind::Ternary: {
      size_t which[kMaxInputs];
      for (size_t k = 0; k < num_inputs; ++k) which[k] = k;
      bool same = true;
      for (size_t k = 1; k < num_inputs; ++k) same = same && impls[k]->shape == impls[0]->shape;
      shapes.out[0] = same ? impls[0]->shape : broadcast_shapes(op, impls, which, num_inputs);
      if (!same) {
        for (size_t k = 0; k < num_inputs; ++k) {
          if (impls[k]->shape == shapes.out[0]) continue;
          shapes.expanded[k] = true;
          shapes.expanded_shape[k] = shapes.out[0];
          shapes.expanded_strides[k] = broadcast_strides(*impls[k], shapes.out[0]);
        }
      }
      break;
    }
    case OpKind::Reduction: {
      const TensorImpl& x = *impls[0];
      if (op.keepdim_attr < 0) {
        if (op.dim_attr >= 0) wrap_dim(attrs.values[op.dim_attr]->i, x.ndim(), op.name);
        shapes.out[0] = x.shape;
        break;
      }
      std::vector<bool> reduce(std::max<size_t>(x.ndim(), 1), false);
      const AttrValue& dim_value = *attrs.values[op.dim_attr];
      std::vector<int64_t> dims = dim_value.type == OAR_ATTR_INTS ? dim_value.ints : std::vector<int64_t>{dim_value.i};
      if (dims.empty()) {
        std::fill(reduce.begin(), reduce.end(), true);
      } else {
        for (int64_t dim : dims) {
          int64_t d = wrap_dim(dim, x.ndim(), op.name);
          if (reduce[d]) shape_error(op.name + ": dim " + std::to_string(d) + " appears twice in dim");
          reduce[d] = true;
        }
      }
      bool keepdim = attrs.values[op.keepdim_attr]->i != 0;
      Dims shape;
      for (size_t d = 0; d < x.ndim(); ++d) {
        if (reduce[d] && op.nonempty_reduction && x.shape[d] == 0) {
          shape_error(op.name + ": cannot reduce over dim " + std::to_string(d) + " of size 0 (shape " +
                      shape_text(x.shape) + ")");
        }
        if (!reduce[d]) {
          shape.push_back(x.shape[d]);
        } else if (keepdim) {
          shape.push_back(1);
        }
      }
      shapes.out[0] = shape;
      break;
    }
    case OpKind::Matmul: {
      const TensorImpl& a = *impls[0];
      const TensorImpl& b = *impls[1];
      if (!op.broadcast && (a.ndim() != 3 || b.ndim() != 3)) {
        shape_error(op.name + ": needs 3-d inputs, got 'a' " + shape_text(a.shape) + " and 'b' " + shape_text(b.shape));
      }
      int64_t m = a.shape[a.ndim() - 2], k1 = a.shape[a.ndim() - 1];
      int64_t k2 = b.shape[b.ndim() - 2], n = b.shape[b.ndim() - 1];
      if (k1 != k2) {
        shape_error(op.name + ": 'a' " + shape_text(a.shape) + " and 'b' " + shape_text(b.shape) +
                    " do not multiply: inner dims " + std::to_string(k1) + " and " + std::to_string(k2) + " differ");
      }
      Dims batch_a(a.shape.data(), a.ndim() - 2), batch_b(b.shape.data(), b.ndim() - 2);
      Dims batch;
      if (!op.broadcast) {
        if (batch_a != batch_b) {
          shape_error(op.name + ": batch sizes differ: 'a' " + shape_text(a.shape) + ", 'b' " + shape_text(b.shape));
        }
        batch = batch_a;
      } else {
        size_t nb = std::max(batch_a.size(), batch_b.size());
        batch = Dims(nb, 1);
        for (const Dims* source : {&batch_a, &batch_b}) {
          size_t lead = nb - source->size();
          for (size_t d = 0; d < source->size(); ++d) {
            int64_t e = (*source)[d];
            if (e == batch[lead + d] || e == 1) continue;
            if (batch[lead + d] != 1) {
              shape_error(op.name + ": batch dims of 'a' " + shape_text(a.shape) + " and 'b' " + shape_text(b.shape) +
                          " do not broadcast");
            }
            batch[lead + d] = e;
          }
        }
        for (size_t k = 0; k < 2; ++k) {
          const TensorImpl& t = *impls[k];
          Dims target = batch;
          target.push_back(t.shape[t.ndim() - 2]);
          target.push_back(t.shape[t.ndim() - 1]);
          if (target == t.shape) continue;
          shapes.expanded[k] = true;
          shapes.expanded_shape[k] = target;
          shapes.expanded_strides[k] = broadcast_strides(t, target);
        }
      }
      Dims shape = batch;
      shape.push_back(m);
      shape.push_back(n);
      shapes.out[0] = shape;
      break;
    }
    default: {
      if (op.shape_rule == nullptr) throw py::type_error(op.name + ": no shape rule for kind " + kind_name(op.kind));
      if (num_outputs != 1) throw py::type_error(op.name + ": a named shape rule gives one output");
      shapes.out[0] = op.shape_rule(RuleArgs{op, impls, num_inputs, attrs});
      break;
    }
  }

}

}  // namespace oar

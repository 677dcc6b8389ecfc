#include "launch.hpp"

#include <cstring>
#include <unordered_map>
#include <vector>

#include "kernels.hpp"
#include "python_hooks.hpp"

namespace oar {

namespace {

struct KernelKey {
  const Plugin* plugin;
  int32_t device;
  int32_t op;
  uint64_t dtypes;
  bool operator==(const KernelKey& other) const {
    return plugin == other.plugin && device == other.device && op == other.op && dtypes == other.dtypes;
  }
};
struct KernelKeyHash {
  size_t operator()(const KernelKey& key) const {
    size_t h = reinterpret_cast<size_t>(key.plugin) * 0x9e3779b97f4a7c15ull;
    h ^= (static_cast<size_t>(key.op) << 20) ^ static_cast<size_t>(key.device);
    return h ^ (key.dtypes * 0xc2b2ae3d27d4eb4full);
  }
};
struct CachedKernel {
  std::shared_ptr<Kernel> kernel;  // kernel->supported false: the host fallback runs
  std::weak_ptr<Plugin> plugin;
};
std::unordered_map<KernelKey, CachedKernel, KernelKeyHash>& kernel_cache() {
  static auto* cache = new std::unordered_map<KernelKey, CachedKernel, KernelKeyHash>();  // leaked
  return *cache;
}

// The operands as tensors (views with the shape and strides the kernel sees): for the host
// fallback and the launch observer.
py::tuple operand_tensors(const Operand* operands, size_t count) {
  py::tuple tuple(count);
  for (size_t k = 0; k < count; ++k) {
    const TensorImpl& impl = *operands[k].impl;
    TensorImpl view = view_impl(impl, operands[k].shape ? *operands[k].shape : impl.shape,
                                operands[k].strides ? *operands[k].strides : impl.strides, impl.offset);
    view.wrapped_number = impl.wrapped_number;
    tuple[k] = py::reinterpret_steal<py::object>(wrap_tensor(std::move(view)));
  }
  return tuple;
}

void run_fallback(const OpSchema& op, const Operand* inputs, size_t num_inputs, const Operand* outputs,
                  size_t num_outputs, const CallAttrs& attrs) {
  py::tuple in = operand_tensors(inputs, num_inputs);
  py::tuple out = operand_tensors(outputs, num_outputs);
  py::object attrs_object = py::reinterpret_steal<py::object>(attrs_dict(op, attrs));
  hooks::run_fallback(op.name_str, in.ptr(), out.ptr(), attrs_object.ptr());
}

void add_note(py::error_already_set& error, const std::string& note) {
  try {
    py::object value = error.value();
    if (py::hasattr(value, "add_note")) value.attr("add_note")(note);
  } catch (py::error_already_set&) {
  }
}

std::string launch_signature(const OpSchema& op, const Operand* inputs, size_t num_inputs, const Operand* outputs,
                             size_t num_outputs) {
  std::string text = op.name + "(";
  for (size_t k = 0; k < num_inputs; ++k) text += std::string(k ? ", " : "") + scalar_info(inputs[k].impl->dtype).name;
  text += ") -> ";
  for (size_t k = 0; k < num_outputs; ++k) text += std::string(k ? ", " : "") + scalar_info(outputs[k].impl->dtype).name;
  return text;
}

// ---- the launch observer (oar_codegen's tracer) ------------------------------------------------

// True when the observer took the launch. fresh_outputs: the outputs were just allocated for it.
bool observer_takes(const OpSchema& op, const Operand* inputs, size_t num_inputs, const Operand* outputs,
                    size_t num_outputs, const CallAttrs& attrs, bool fresh_outputs) {
  py::object observer = py::reinterpret_borrow<py::object>(t_launch_observer);
  py::tuple in = operand_tensors(inputs, num_inputs);
  py::tuple out = operand_tensors(outputs, num_outputs);
  py::object attrs_object = py::reinterpret_steal<py::object>(attrs_dict(op, attrs));
  return hooks::observer_takes(observer.ptr(), op.name_str, in.ptr(), out.ptr(), attrs_object.ptr(), fresh_outputs);
}

}  // namespace

void launch(const OpSchema& op, DeviceInfo* device, Stream& stream, const Operand* inputs, size_t num_inputs,
            const Operand* outputs, size_t num_outputs, const CallAttrs& attrs, bool fresh_outputs) {
  if (t_launch_observer != nullptr &&
      observer_takes(op, inputs, num_inputs, outputs, num_outputs, attrs, fresh_outputs)) {
    return;
  }
  uint64_t packed = 0;
  size_t slot = 0;
  for (size_t k = 0; k < num_inputs; ++k, ++slot) packed |= static_cast<uint64_t>(inputs[k].impl->dtype) << (4 * slot);
  for (size_t k = 0; k < num_outputs; ++k, ++slot) packed |= static_cast<uint64_t>(outputs[k].impl->dtype) << (4 * slot);
  packed |= static_cast<uint64_t>(slot) << 60;
  KernelKey key{device->plugin, device->index, op.id, packed};
  auto& cache = kernel_cache();
  auto found = cache.find(key);
  if (found == cache.end() || found->second.plugin.expired()) {
    std::shared_ptr<Plugin> plugin = plugin_of(device);
    std::vector<oar_dl_data_type> dtypes;
    for (size_t k = 0; k < num_inputs; ++k) dtypes.push_back(scalar_info(inputs[k].impl->dtype).dl);
    for (size_t k = 0; k < num_outputs; ++k) dtypes.push_back(scalar_info(outputs[k].impl->dtype).dl);
    CachedKernel entry{lookup_kernel(plugin, device->index, op.name, dtypes), plugin};
    found = cache.insert_or_assign(key, std::move(entry)).first;
  }
  const Kernel& kernel = *found->second.kernel;
  if (!kernel.supported) {
    run_fallback(op, inputs, num_inputs, outputs, num_outputs, attrs);
    return;
  }
  bool any_elements = num_outputs == 0;
  for (size_t k = 0; k < num_outputs; ++k) any_elements = any_elements || outputs[k].impl->numel() > 0;
  if (!any_elements) return;  // nothing to write (the ABI never touches empty tensors)

  oar_dl_tensor in[kMaxInputs];
  oar_dl_tensor out[kMaxOutputs];
  for (size_t k = 0; k < num_inputs; ++k) {
    inputs[k].impl->fill_dl(in[k]);
    if (inputs[k].shape) in[k].shape = const_cast<int64_t*>(inputs[k].shape->data());
    if (inputs[k].strides) in[k].strides = const_cast<int64_t*>(inputs[k].strides->data());
    if (inputs[k].shape) in[k].ndim = static_cast<int32_t>(inputs[k].shape->size());
  }
  for (size_t k = 0; k < num_outputs; ++k) outputs[k].impl->fill_dl(out[k]);
  oar_attr attr_array[kMaxAttrs];
  for (size_t k = 0; k < op.attrs.size(); ++k) fill_attr(attr_array[k], op.attrs[k], *attrs.values[k]);
  Plugin& plugin = stream.plugin();
  plugin.ensure_usable();
  oar_stream handle = stream.handle();
  auto entry = plugin.table().kernel_launch;
  oar_kernel kernel_handle = kernel.handle;
  size_t num_attrs = op.attrs.size();
  oar_status status = plugin.counted([&] {
    return entry(handle, kernel_handle, num_inputs ? in : nullptr, num_inputs, num_outputs ? out : nullptr,
                 num_outputs, num_attrs ? attr_array : nullptr, num_attrs);
  });
  if (status != OAR_SUCCESS) {
    try {
      plugin.raise_status("kernel_launch", status);
    } catch (py::error_already_set& error) {
      add_note(error, "while launching " + launch_signature(op, inputs, num_inputs, outputs, num_outputs) + " on " +
                          device->name);
      throw;
    }
  }
}

size_t kernel_cache_size() { return kernel_cache().size(); }

}  // namespace oar

#include "dlpack.hpp"

#include <cstring>
#include <vector>

#include "host_buffer.hpp"
#include "tensor.hpp"

namespace oar {

namespace {


struct DLManaged {  // DLManagedTensor (legacy, unversioned) of dlpack.h
  oar_dl_tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManaged* self);
};

struct DLExport {
  DLManaged managed;
  TensorImpl impl;
};

void dl_export_delete(DLManaged* managed) { delete static_cast<DLExport*>(managed->manager_ctx); }

void dl_capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;  // consumed ("used_dltensor"): the consumer deletes it
  auto* managed = static_cast<DLManaged*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

}  // namespace

PyObject* method_dlpack(PyObject* self, PyObject* args, PyObject* kwargs) {
  OAR_TRY
  static const char* keywords[] = {"stream", "max_version", "dl_device", "copy", nullptr};
  PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O$OOO", const_cast<char**>(keywords), &stream, &max_version,
                                   &dl_device, &copy)) {
    return nullptr;
  }
  const TensorImpl& impl = impl_of(self);
  if (dl_device != Py_None) {
    py::tuple wanted = py::reinterpret_borrow<py::object>(dl_device).cast<py::tuple>();
    int type = wanted[0].cast<int>();
    int id = wanted[1].cast<int>();
    if (type != OAR_DL_EXT_DEV || id != impl.device()->index) {
      PyErr_Format(PyExc_BufferError,
                   "this oar tensor lives in the memory of %s (DLPack kDLExtDev, device %d), which a consumer "
                   "asking for DLPack device (%d, %d) cannot read and oar does not copy through DLPack: use "
                   "t.numpy() for a host copy",
                   impl.device()->name.c_str(), impl.device()->index, type, id);
      return nullptr;
    }
  }
  if (copy == Py_True) {
    PyErr_SetString(PyExc_BufferError, "oar exports device tensors without copying: use t.clone() or t.numpy()");
    return nullptr;
  }
  auto* exported = new DLExport();
  exported->impl = view_impl(impl, impl.shape, impl.strides, impl.offset);
  exported->impl.fill_dl(exported->managed.dl_tensor);
  exported->managed.manager_ctx = exported;
  exported->managed.deleter = dl_export_delete;
  PyObject* capsule = PyCapsule_New(&exported->managed, "dltensor", dl_capsule_destructor);
  if (capsule == nullptr) {
    delete exported;
    return nullptr;
  }
  return capsule;
  OAR_CATCH(nullptr)
}

PyObject* method_dlpack_device(PyObject* self, PyObject*) {
  return Py_BuildValue("(ii)", static_cast<int>(OAR_DL_EXT_DEV), impl_of(self).device()->index);
}


// Import a host DLPack capsule (kDLCPU) by copying it to the device.
py::object from_dlpack_capsule(py::handle capsule, const std::shared_ptr<Plugin>& plugin, int32_t index) {
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    throw py::type_error("from_dlpack: expected an unconsumed 'dltensor' capsule");
  }
  auto* managed = static_cast<DLManaged*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  // Consumed from here on: we call the deleter.
  if (PyCapsule_SetName(capsule.ptr(), "used_dltensor") != 0) throw py::error_already_set();
  struct Release {
    DLManaged* managed;
    ~Release() {
      if (managed->deleter != nullptr) managed->deleter(managed);
    }
  } release{managed};
  const oar_dl_tensor& source = managed->dl_tensor;
  if (source.device.device_type != OAR_DL_CPU) {
    throw py::buffer_error("from_dlpack: only host memory (kDLCPU) can be imported, not device type " +
                           std::to_string(source.device.device_type));
  }
  ScalarType dtype = scalar_type_from_dl(source.dtype, "from_dlpack");
  if (source.ndim < 0) throw py::value_error("from_dlpack: negative ndim");
  Dims shape(source.shape, static_cast<size_t>(source.ndim));
  DeviceInfo* device = device_info(plugin, index);
  Stream& stream = current_stream(device);
  TensorImpl impl = empty_impl(device, shape, dtype, stream);
  size_t item = itemsize(dtype);
  size_t count = static_cast<size_t>(impl.numel());  // checked by empty_impl
  if (count > 0) {
    const char* base = static_cast<const char*>(source.data) + source.byte_offset;
    std::vector<char> gathered;
    const char* bytes = base;
    bool dense = source.strides == nullptr;
    if (!dense) {
      Dims strides(source.strides, shape.size());
      TensorImpl probe;
      probe.shape = shape;
      probe.strides = strides;
      dense = probe.is_contiguous();
      if (!dense) {
        for (size_t d = 0; d < shape.size(); ++d) {
          if (strides[d] < 0) throw py::value_error("from_dlpack: negative strides are not supported");
        }
        gathered.resize(count * item);
        std::vector<int64_t> position(shape.size(), 0);
        for (size_t n = 0; n < count; ++n) {
          int64_t element = 0;
          for (size_t d = 0; d < shape.size(); ++d) element += position[d] * strides[d];
          std::memcpy(gathered.data() + n * item, base + element * static_cast<int64_t>(item), item);
          for (size_t d = shape.size(); d-- > 0;) {
            if (++position[d] < shape[d]) break;
            position[d] = 0;
          }
        }
        bytes = gathered.data();
      }
    }
    Plugin& owner = stream.plugin();
    owner.call("memcpy_h2d_async", owner.table().memcpy_h2d_async, stream.handle(),
               reinterpret_cast<void*>(impl.storage->data()), static_cast<const void*>(bytes), count * item);
    stream.synchronize();  // the producer's memory is released right after
  }
  return py::reinterpret_steal<py::object>(wrap_tensor(std::move(impl)));
}


}  // namespace oar

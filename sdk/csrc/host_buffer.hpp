// Host memory handed in from Python: any C-contiguous buffer-protocol object
// (bytes, bytearray, numpy array, memoryview) or a raw address as an int.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every unit: one set of type casters (ODR)

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace oar {

namespace py = pybind11;

class HostBuffer {
 public:
  // Holds the buffer (and so the object) until destroyed; needs the GIL to destroy.
  static HostBuffer borrow(py::handle object, bool writable) {
    HostBuffer buffer;
    if (PyLong_Check(object.ptr())) {
      buffer.data_ = reinterpret_cast<void*>(object.cast<uintptr_t>());
      buffer.size_known_ = false;
      return buffer;
    }
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object.ptr(), &buffer.view_, flags) != 0) {
      PyErr_Clear();
      throw py::type_error(std::string("host memory must be a C-contiguous") + (writable ? ", writable" : "") +
                           " buffer (numpy array, bytearray, memoryview) or an int address, not " +
                           py::str(py::type::handle_of(object).attr("__name__")).cast<std::string>());
    }
    buffer.has_view_ = true;
    buffer.data_ = buffer.view_.buf;
    buffer.size_ = static_cast<size_t>(buffer.view_.len);
    return buffer;
  }

  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }
  HostBuffer& operator=(HostBuffer&& other) noexcept {
    if (this != &other) {
      release();
      view_ = other.view_;
      has_view_ = std::exchange(other.has_view_, false);
      data_ = other.data_;
      size_ = other.size_;
      size_known_ = other.size_known_;
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { release(); }

  void* data() const { return data_; }

  // The byte count to copy: `requested` if given (at most the buffer's size), else the whole buffer.
  size_t transfer_size(std::optional<size_t> requested) const {
    if (!size_known_) {
      if (!requested) throw py::value_error("a raw host address needs an explicit size");
      return *requested;
    }
    if (requested && *requested > size_) {
      throw py::value_error("size " + std::to_string(*requested) + " exceeds the host buffer's " +
                            std::to_string(size_) + " bytes");
    }
    return requested ? *requested : size_;
  }

 private:
  void release() {
    if (has_view_) {
      PyBuffer_Release(&view_);
      has_view_ = false;
    }
  }

  Py_buffer view_{};
  bool has_view_ = false;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool size_known_ = true;
};

}  // namespace oar

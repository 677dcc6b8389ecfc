// Views and indexing: reshape/view, transpose, permute, expand, slice, split (views that share
// storage, recorded for autograd), concat and copy_into (the copy kernel into a view), and
// x[key] / x[key] = value with ints, slices, None and the ellipsis.
#pragma once

#include <Python.h>

#include <initializer_list>
#include <utility>
#include <vector>

#include "op_schema.hpp"

namespace oar {

PyObject* reshape_impl(PyObject* x, const Dims& requested, bool view_only);  // new references
PyObject* transpose_impl(PyObject* x, int64_t dim0, int64_t dim1);
PyObject* permute_impl(PyObject* x, const std::vector<int64_t>& dims);
PyObject* expand_impl(PyObject* x, const Dims& requested);
PyObject* slice_impl(PyObject* x, int64_t dim, int64_t start, int64_t stop, int64_t step);
PyObject* split_impl(PyObject* x, const std::vector<int64_t>& sizes, int64_t dim);  // a tuple
PyObject* concat_impl(PyObject* sequence, int64_t dim);
// A view op of ops.yaml called through its op function (oar.ops.reshape, ...).
PyObject* run_view(const OpSchema& op, PyObject* const* inputs, size_t num_inputs, CallAttrs& attrs);

// Launch the copy kernel from src (a tensor of dst's device, a number or an array-like; any
// strides, broadcast to dst's shape, cast to its dtype) into the view dst.
void copy_into(const TensorImpl& dst, PyObject* src_object);
[[noreturn]] void inplace_grad_error(const char* what);
// Raise as torch does when an in-place write targets a view whose elements share memory
// (a stride-0 dim of size > 1, as from expand).
void check_no_internal_overlap(const TensorImpl& target, const char* what);

// The view x[key] (ints, slices, None, ...), never recorded.
TensorImpl index_view(const TensorImpl& x, PyObject* key);
PyObject* getitem_impl(PyObject* self, PyObject* key);  // x[key], recorded as slices and a reshape

// A tuple of items (new references taken); a dict of name: value (the values' references stolen).
PyObject* tuple_of(std::initializer_list<PyObject*> items);
PyObject* dict_of(std::initializer_list<std::pair<const char*, PyObject*>> items);

}  // namespace oar

/* Every kernel_launch allocates a "launch packet" (what an asynchronous plugin queues for its worker)
 * and never frees it: the leak of issue 20. Results are right. */
#include <stdlib.h>

#include "shim.h"

struct launch_packet {
  oar_stream stream;
  oar_kernel kernel;
  size_t num_inputs, num_outputs, num_attrs;
};

static struct launch_packet* volatile last_packet;  /* overwritten each launch: the previous one is lost */

static oar_status leaky_kernel_launch(oar_stream stream, oar_kernel kernel, const oar_dl_tensor* inputs,
                                      size_t num_inputs, const oar_dl_tensor* outputs, size_t num_outputs,
                                      const oar_attr* attrs, size_t num_attrs) {
  struct launch_packet* packet = malloc(sizeof *packet);
  if (packet) {
    packet->stream = stream;
    packet->kernel = kernel;
    packet->num_inputs = num_inputs;
    packet->num_outputs = num_outputs;
    packet->num_attrs = num_attrs;
  }
  last_packet = packet;
  return inner->kernel_launch(stream, kernel, inputs, num_inputs, outputs, num_outputs, attrs, num_attrs);
}

static void shim_customize(oar_device_table* table) { table->kernel_launch = leaky_kernel_launch; }

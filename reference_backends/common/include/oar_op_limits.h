/* The limits of a library kernel launch that every reference plugin shares.
 *
 * interface/ops.yaml must fit them: common/ops_yaml.py (MAX_INPUTS ...) rejects an
 * op that does not, and each generated <prefix>_op_decls.h re-checks the plugin's
 * copies with a static assert. Plain C, includable from C and C++. */
#ifndef OAR_REFERENCE_OP_LIMITS_H_
#define OAR_REFERENCE_OP_LIMITS_H_

#define OAR_OP_MAX_INPUTS 4
#define OAR_OP_MAX_OUTPUTS 2
#define OAR_OP_MAX_ATTRS 6
#define OAR_OP_ATTR_MAX_ITEMS 8   /* entries of an ints/floats attribute */
#define OAR_OP_ATTR_MAX_STRING 32 /* bytes of a string attribute, NUL included */

#endif /* OAR_REFERENCE_OP_LIMITS_H_ */

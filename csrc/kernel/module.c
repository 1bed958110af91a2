/* allocsim.policies._kernel: the compiled FreeList and pool-policy hot path (see pool_kernel.c). */
#include "freelist.h"
#include "live.h"

extern PyTypeObject Kernel_Type;
int kernel_type_init(void);

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "allocsim.policies._kernel",
    .m_doc = "Compiled hot path of allocsim's pool policies; allocsim.policies.kernel loads it.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__kernel(void) {
    if (kernel_constants_init() < 0 || kernel_type_init() < 0 || live_key_init() < 0) return NULL;
    if (PyType_Ready(&FreeList_Type) < 0 || PyType_Ready(&Kernel_Type) < 0 || PyType_Ready(&LiveTable_Type) < 0
            || PyType_Ready(&PendingSet_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&kernel_module);
    if (!m) return NULL;
    Py_INCREF(&FreeList_Type);
    if (PyModule_AddObject(m, "FreeList", (PyObject *)&FreeList_Type) < 0) goto error;
    Py_INCREF(&Kernel_Type);
    if (PyModule_AddObject(m, "Kernel", (PyObject *)&Kernel_Type) < 0) goto error;
    Py_INCREF(&LiveTable_Type);
    if (PyModule_AddObject(m, "LiveTable", (PyObject *)&LiveTable_Type) < 0) goto error;
    /* Bumped whenever the Python side must be rebuilt with the C side (checked by the loader). */
    if (PyModule_AddIntConstant(m, "ABI_VERSION", 2) < 0) goto error;
    return m;
error:
    Py_DECREF(m);
    return NULL;
}

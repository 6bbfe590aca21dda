// error.h is header-only; this file anchors the dsv4_core library.
#include "core/error.h"

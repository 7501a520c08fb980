/* dist/comm.c - communicators and the collective ops (in progress). */
#include "dist/dist.h"

# zklock: PGXS build.  "make && make install" against the pg_config on PATH.

MODULE_big = zklock
OBJS = zklock.o zk_observe.o zk_shared.o zk_holds.o zk_recipe.o zk_deadlock.o zk_queue.o zk_session.o zk_janitor.o zk_names.o
EXTENSION = zklock
DATA = zklock--1.0.sql
PGFILEDESC = "zklock - cluster-wide locks backed by Apache ZooKeeper"

REGRESS = zklock
REGRESS_OPTS = --load-extension=zklock

PG_CPPFLAGS = -DTHREADED -Wall -Wextra -Werror -Wno-unused-parameter \
	-Wno-missing-field-initializers
SHLIB_LINK = -lzookeeper_mt -lpthread

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

/* SPDX-License-Identifier: MIT */
#include "mapper.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mapper_map_one(struct engine *e, struct engine_item *it)
{
	struct chunk *c = it->chunk;
	int d = it->owner.device;
	double start = now_monotonic_s();
	int r;

	r = backend_mem_create_map(e->backend, d, c->va, c->size, &c->handle);
	engine_time_add(&e->map_ns, start);
	if (r < 0)
		return error_prefix(r, "mapping %zu bytes on device %d", c->size, d);
	c->mapped = true;
	it->mapped_here = true;
	engine_account_device(e, &it->owner, (int64_t)c->size);
	return 0;
}

/* Each thread claims the next chunk in order and maps it. */
static void *mapper_main(void *arg)
{
	struct mapper *mp = arg;

	for (;;) {
		size_t k;
		int r;

		pthread_mutex_lock(&mp->lock);
		if (mp->stop || mp->error || mp->claimed == mp->count) {
			pthread_mutex_unlock(&mp->lock);
			break;
		}
		k = mp->claimed++;
		pthread_mutex_unlock(&mp->lock);
		r = mapper_map_one(mp->e, mp->queue[k]);
		pthread_mutex_lock(&mp->lock);
		if (r < 0 && !mp->error) {
			mp->error = r;
			snprintf(mp->message, sizeof(mp->message), "%s", dormant_last_error());
		}
		if (r == 0)
			mp->mapped[k] = true;
		pthread_cond_broadcast(&mp->cond);
		pthread_mutex_unlock(&mp->lock);
		if (r < 0)
			break;
	}
	return NULL;
}

int mapper_start(struct mapper *mp, struct engine *e, int d, struct engine_item *items,
		 size_t count)
{
	unsigned threads = MIN(MAX(e->map_threads, 1u), (unsigned)MAPPER_THREADS_MAX);

	memset(mp, 0, sizeof(*mp));
	mp->e = e;
	mp->device = d;
	pthread_mutex_init(&mp->lock, NULL);
	pthread_cond_init(&mp->cond, NULL);
	mp->queue = malloc(MAX(count, (size_t)1) * sizeof(*mp->queue));
	mp->mapped = calloc(MAX(count, (size_t)1), sizeof(*mp->mapped));
	if (!mp->queue || !mp->mapped)
		return error_set(-ENOMEM, "out of host memory");
	for (size_t i = 0; i < count; i++)
		if (items[i].owner.device == d && !items[i].chunk->mapped)
			mp->queue[mp->count++] = &items[i];
	threads = (unsigned)MIN((size_t)threads, mp->count);
	/* Without a thread, mapper_wait() maps each chunk itself. */
	while (mp->running < threads &&
	       pthread_create(&mp->threads[mp->running], NULL, mapper_main, mp) == 0)
		mp->running++;
	return 0;
}

int mapper_wait(struct mapper *mp, struct engine_item *it)
{
	size_t k = mp->next;
	double start;
	int r = 0;

	if (k == mp->count || mp->queue[k] != it)
		return 0; /* not one of ours: mapped already */
	mp->next++;
	start = now_monotonic_s();
	if (!mp->running) {
		r = mapper_map_one(mp->e, it);
		mp->wait_s += now_monotonic_s() - start;
		return r;
	}
	pthread_mutex_lock(&mp->lock);
	while (!mp->mapped[k] && !mp->error)
		pthread_cond_wait(&mp->cond, &mp->lock);
	/* a chunk mapped before a later one failed is used: the wake fails at
	 * the first chunk that has no memory, whichever thread was first */
	if (!mp->mapped[k])
		r = error_set(mp->error, "%s", mp->message);
	pthread_mutex_unlock(&mp->lock);
	mp->wait_s += now_monotonic_s() - start;
	return r;
}

void mapper_finish(struct mapper *mp, struct engine_totals *t)
{
	pthread_mutex_lock(&mp->lock);
	mp->stop = true;
	pthread_mutex_unlock(&mp->lock);
	for (unsigned i = 0; i < mp->running; i++)
		pthread_join(mp->threads[i], NULL);
	t->times.map_wait_s += mp->wait_s;
	/* Counted here, on the consumer's thread, once the threads are done. */
	for (size_t k = 0; k < mp->count; k++) {
		struct engine_item *it = mp->queue[k];

		if (!it->mapped_here)
			continue;
		it->change->bytes_mapped += it->chunk->size;
		t->mapped += it->chunk->size;
	}
	pthread_cond_destroy(&mp->cond);
	pthread_mutex_destroy(&mp->lock);
	free(mp->mapped);
	free(mp->queue);
}

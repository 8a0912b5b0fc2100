import { defineConfig } from 'vitest/config';

// Built once into dist/ with fixed names; Django serves dist/ under /static/.
export default defineConfig({
  base: '/static/',
  publicDir: false,
  oxc: {
    jsx: { runtime: 'automatic', importSource: 'preact' },
  },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    target: 'es2020',
    cssCodeSplit: false,
    sourcemap: false,
    modulePreload: false,
    // One bundle on purpose (KaTeX is a good part of it): replies typeset at once, offline too.
    chunkSizeWarningLimit: 600,
    // Fonts as files, never inlined as data: URLs (the page's CSP takes fonts from 'self' only).
    assetsInlineLimit: 0,
    rolldownOptions: {
      input: 'src/main.tsx',
      output: {
        format: 'es',
        entryFileNames: 'app.js',
        chunkFileNames: 'assets/[name]-[hash].js',
        assetFileNames: (info) =>
          (info.names || [info.name || '']).some((n) => n && n.endsWith('.css')) ? 'app.css' : 'assets/[name]-[hash][extname]',
      },
    },
  },
  // The README's test ids are checked against the server's templates too (tests/readme-test-ids.test.ts).
  server: { fs: { allow: ['.', '../chatapp'] } },
  test: {
    environment: 'jsdom',
    include: ['tests/**/*.test.{ts,tsx}'],
  },
});
